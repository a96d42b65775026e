# `runtime serve` in a container (docs/DEPLOY.md). Not built in CI: the machines CI runs on
# have no Docker engine.
#
#   docker build -t runtime .
#   docker run --rm -p 8080:8080 --stop-timeout 30 \
#     -v "$PWD/artifacts/smollm2-135m-instruct:/models/smollm2-135m-instruct:ro" runtime
#
# The model is mounted, not built in: the image holds only the programs. Another model:
# mount its artifact directory and give `--artifacts /models/NAME` (the directory's name is
# the model's name in the API).

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The kernels pick AVX-512 or AVX2 when the program starts, so the image runs on any x86-64.
RUN cargo build --release --locked --bin runtime --bin converter

FROM debian:bookworm-slim
# curl for the health check; a user of its own, not root.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --uid 10001 runtime
COPY --from=build /src/target/release/runtime /src/target/release/converter /usr/local/bin/
USER runtime
EXPOSE 8080
# 503 while the model loads, 200 once it answers. (Docker and Compose act on this;
# Kubernetes ignores it and has its own probes: docs/DEPLOY.md.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/health || exit 1
# Exec form: the server is PID 1 and gets SIGTERM itself (`docker stop`), finishes the
# requests under way within --shutdown-timeout (20 s; give `docker stop` longer), and exits.
# Bound to every address of the container: the Host check applies only on loopback.
ENTRYPOINT ["runtime", "serve", "--host", "0.0.0.0", "--port", "8080"]
CMD ["--artifacts", "/models/smollm2-135m-instruct"]
