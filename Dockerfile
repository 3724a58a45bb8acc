# The demo workload of docker-compose.yml (`dpobs demo` against the embedded data plane), and
# the image the Kubernetes manifests run `dpobs agent` from (deploy/kubernetes).
FROM python:3.11-slim
# `dpobs agent` runs the real Prometheus binary in agent mode (Debian bookworm ships 2.42).
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/*
# CPU-only torch first and pinned: the default index resolves a multi-GB CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir .
# file_sd files are written 0600 and Prometheus runs as nobody, so the demo runs as nobody
# too; its sd dir seeds the fresh shared volume with that owner (compose starts it first).
RUN mkdir -p /var/lib/dpobs/file_sd && chown 65534:65534 /var/lib/dpobs/file_sd
USER 65534:65534
ENTRYPOINT ["dpobs"]
CMD ["demo"]
