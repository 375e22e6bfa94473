# syntax=docker/dockerfile:1
# The ringlimit node image: `docker build -t ringlimit:0.1.0 .` at the repository's top.
# Needs BuildKit (Docker's default builder since 23.0; `DOCKER_BUILDKIT=1` on older ones) for
# the cache mounts, which keep the crates.io downloads and compiled dependencies between builds.

FROM rust:1-bookworm AS build
WORKDIR /src
# The whole workspace (all members must be present for Cargo to load it); .dockerignore keeps
# target/, .git and benchmark output out of the context.
COPY . .
# No debug info in the image's binary (the workspace's release profile keeps some for
# profiling); symbols stay, so panics still name their functions.
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p ringlimit-node --bin ringlimit \
    && cp target/release/ringlimit /ringlimit

# The binary links glibc (libc, libm, libgcc_s; mimalloc is compiled in): distroless/cc has
# exactly those, no shell and no package manager. Its `nonroot` user is 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /ringlimit /ringlimit
USER 65532:65532
# HTTP API; node-to-node port: peer RPC over TCP and gossip over UDP on the same number.
EXPOSE 8080/tcp 7946/tcp 7946/udp
# Every flag can also come from RINGLIMIT_<FLAG> variables (see deploy/k8s). Defaults bind
# 127.0.0.1, which is unreachable from outside a container: pass e.g.
#   docker run -e RINGLIMIT_HTTP=0.0.0.0:8080 -e RINGLIMIT_PEER=0.0.0.0:7946 -p 8080:8080 ringlimit:0.1.0
ENTRYPOINT ["/ringlimit", "serve"]
