# Sourced by the GPU cluster benchmarks' wrappers (bench/cluster_run.sh, bench/policy_run.sh) from the
# repo root: where python3 lacks Ray Serve and the cluster's packages (the GPU image), unpack
# .device/pyextra.tar.xz (made by ../shared/tools/pack-python-for-device.sh) once into /tmp/pyextra
# and put it on the paths; a box with its own venv keeps it. Then the settings a run of thousands of
# streams needs.
if ! python3 -c 'import ray.serve, fastapi, pydantic, typer, httpx' 2>/dev/null; then
  if [ ! -d /tmp/pyextra/ray ]; then
    [ -s .device/pyextra.tar.xz ] || { echo "no Ray here and no .device/pyextra.tar.xz to unpack" >&2; exit 2; }
    mkdir -p /tmp/pyextra && tar xJf .device/pyextra.tar.xz -C /tmp/pyextra --strip-components=1
  fi
  export PYTHONPATH=/tmp/pyextra:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/pyextra/bin:$PATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true  # thousands of streams at once
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
