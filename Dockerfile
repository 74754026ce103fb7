# syntax=docker/dockerfile:1
# The Cascade node and CLI in a small image.
#
#   docker build -t cascade:dev .
#   docker run --rm cascade:dev --help
#   docker compose -f deploy/compose/compose.yaml up   # three regions, mutual TLS
#
# Build: the whole workspace's release binary, with the toolchain the
# project is tested on (no protoc: protox compiles the .proto files).
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin cascade \
 && cp target/release/cascade /usr/local/bin/cascade

# Run: glibc (the binary links it; TLS is rustls, no OpenSSL), a non-root
# user, and a data volume. The schema the binary embeds is also copied
# for configurations that name it.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/cascade --shell /usr/sbin/nologin cascade \
 && mkdir -p /var/lib/cascade /etc/cascade \
 && chown cascade:cascade /var/lib/cascade
COPY --from=build /usr/local/bin/cascade /usr/local/bin/cascade
COPY deploy/schemas/ /etc/cascade/schemas/
USER 10001:10001
WORKDIR /var/lib/cascade
VOLUME ["/var/lib/cascade"]
# gRPC (clients, peers, health, reflection) and Prometheus metrics.
EXPOSE 50051 9090
# Logs one JSON object per line for collectors (CASCADE_LOG_FORMAT=text for people).
ENV CASCADE_LOG_FORMAT=json
ENTRYPOINT ["/usr/local/bin/cascade"]
CMD ["serve", "--config", "/etc/cascade/node.toml"]
