#!/usr/bin/env python3
"""Renders chat-template test cases with Python jinja2, configured as transformers'
_compile_jinja_template configures it (src/transformers/utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[generation tag,
loopcontrols]), tojson = json.dumps(ensure_ascii=False, ...), raise_exception, strftime_now, a dict
global and a namespace that refuses underscore names. The C++ engine's output is compared with this.

  jinja_oracle.py IN.json OUT.json
IN:  {"templates": {"name": "source", ...}, "cases": [{"template": "name", "context": {...}}, ...]}
     (a case may give "source" instead of "template")
OUT: [{"ok": true, "text": "..."} or {"ok": false, "error": "Type: message"}, ...]
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers uses it to track
    assistant tokens; the text is unchanged)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


class TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError("underscore-prefixed namespace attribute")


def make_env(trim_blocks=True, lstrip_blocks=True):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=trim_blocks, lstrip_blocks=lstrip_blocks, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    env = make_env()
    compiled = {}
    out = []
    for case in spec["cases"]:
        try:
            if "source" in case:
                tmpl = env.from_string(case["source"])
            else:
                name = case["template"]
                if name not in compiled:
                    compiled[name] = env.from_string(spec["templates"][name])
                tmpl = compiled[name]
            out.append({"ok": True, "text": tmpl.render(**case["context"])})
        except Exception as e:  # every failure is an expected outcome the C++ side must match
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
