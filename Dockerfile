# syntax=docker/dockerfile:1
# The Cascade node and CLI in a small image.
#
#   docker build -t cascade:dev .
#   docker run --rm cascade:dev --help
#   docker compose -f deploy/compose/compose.yaml up   # three regions of two nodes over PostgreSQL
#   docker run -v cascade-eu-west:/var/lib/cascade cascade:dev \
#     serve --region eu-west --listen 0.0.0.0:50051 --data-dir /var/lib/cascade/data   # one node, on sled
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
# user, and a data directory it owns for a node on an embedded engine,
# which mounts a volume there. No VOLUME: the compose and Kubernetes
# regions keep their state in PostgreSQL, and an image volume would give
# each of their containers an anonymous volume that nothing uses. The
# schema the binary embeds is also copied for configurations that name it.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/cascade --shell /usr/sbin/nologin cascade \
 && mkdir -p /var/lib/cascade /etc/cascade \
 && chown cascade:cascade /var/lib/cascade
COPY --from=build /usr/local/bin/cascade /usr/local/bin/cascade
COPY deploy/schemas/ /etc/cascade/schemas/
USER 10001:10001
WORKDIR /var/lib/cascade
# gRPC (clients, peers, health, reflection) and Prometheus metrics.
EXPOSE 50051 9090
# Logs one JSON object per line for collectors (CASCADE_LOG_FORMAT=text for people).
ENV CASCADE_LOG_FORMAT=json
ENTRYPOINT ["/usr/local/bin/cascade"]
CMD ["serve", "--config", "/etc/cascade/node.toml"]
