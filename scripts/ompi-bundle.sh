#!/usr/bin/env bash
# Open MPI for the GPU machine, which has no Debian packages: this machine's mpirun, orted, their
# components and the shared libraries they need, relocated under one folder (Open MPI reads
# OPAL_PREFIX), so `mpirun -np N m3mono ... --device cuda --tp N` can be tried there.
#   scripts/ompi-bundle.sh pack FILE.tar.xz     here (needs scripts/install-deps.sh's Open MPI)
#   eval "$(scripts/ompi-bundle.sh env DIR)"    there, after `tar -C DIR -xJf FILE.tar.xz`: sets
#                                               PATH, LD_LIBRARY_PATH, OPAL_PREFIX and the MCA knobs
set -euo pipefail
cmd=${1:?usage: ompi-bundle.sh pack FILE.tar.xz | env DIR}
case "$cmd" in
  pack)
    out=$(realpath -m "${2:?usage: ompi-bundle.sh pack FILE.tar.xz}")
    W=$(mktemp -d)
    trap 'rm -rf "$W"' EXIT
    A=/usr/lib/x86_64-linux-gnu
    mkdir -p "$W/usr/bin" "$W/usr/lib/x86_64-linux-gnu" "$W/usr/share" "$W/lib"
    cp -L /usr/bin/orterun /usr/bin/orted "$W/usr/bin/"
    ln -s orterun "$W/usr/bin/mpirun"
    cp -a "$A/openmpi" "$A/pmix2" "$W/usr/lib/x86_64-linux-gnu/"
    rm -rf "$W/usr/lib/x86_64-linux-gnu/openmpi/include" "$W/usr/lib/x86_64-linux-gnu/pmix2/include"
    cp -a /usr/share/openmpi "$W/usr/share/" 2>/dev/null || true
    cp -a /usr/share/pmix "$W/usr/share/" 2>/dev/null || true
    # every shared library the binaries and components load, but libc's family
    find "$W/usr" -type f \( -name '*.so*' -o -perm -u+x \) -print0 | xargs -0 ldd 2>/dev/null |
      awk '/=> \// {print $3}' | sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so' |
      while read -r l; do cp -nL "$l" "$W/lib/"; done
    tar -C "$W" -cf - . | xz -T2 -6 >"$out"
    du -sh "$out"
    ;;
  env)
    D=$(realpath "${2:?usage: ompi-bundle.sh env DIR}")
    cat <<EOF
export OPAL_PREFIX="$D/usr"
export PATH="$D/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu/openmpi/lib:$D/usr/lib/x86_64-linux-gnu/pmix2/lib:$D/lib:\${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_btl=self,vader
EOF
    ;;
  *) echo "usage: ompi-bundle.sh pack FILE.tar.xz | env DIR" >&2; exit 2 ;;
esac
