// What m3mono router-probe prints: a table (stdout) or, with --json, one JSON object (schema
// "m3mono-router-probe/1") for each of its two modes. docs/router-probe.md explains every field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ref/router_end_to_end.h"
#include "ref/router_probe.h"

namespace m3::cli {

struct ProbeReport {  // the fixed-activation probe
  std::string model;
  int prompt_tokens = 0, decode_tokens = 0, num_experts = 0, top_k = 0;
  double weight_tol = 0;
  std::vector<int32_t> tokens;  // fed at positions 0, 1, ... (row r = position r)
  std::vector<ref::RouterLayerProbe> layers;
};

struct EndToEndReport {
  std::string model;
  int prompt_tokens = 0;
  std::vector<int> layers;  // where expert sets were compared
  ref::EndToEndComparison cmp;
};

void print_probe_text(const ProbeReport& r);
nlohmann::ordered_json probe_json(const ProbeReport& r);
void print_end_to_end_text(const EndToEndReport& r);
nlohmann::ordered_json end_to_end_json(const EndToEndReport& r);

}  // namespace m3::cli
