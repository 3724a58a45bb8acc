# The demo workload of docker-compose.yml: `dpobs demo` against the embedded data plane.
FROM python:3.11-slim
# CPU-only torch first and pinned: the default index resolves a multi-GB CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir .
ENTRYPOINT ["dpobs"]
CMD ["demo"]
