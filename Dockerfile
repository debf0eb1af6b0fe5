# syntax=docker/dockerfile:1
# The edge image: built in a full Rust image, shipped on distroless (glibc, CA
# certificates, no shell, no package manager) as a non-root user. ring is the only
# native code and needs just a C compiler at build time. The binary is stripped (the
# release profile keeps line tables for profiling: 4x the size). Without Docker,
# image/build.sh assembles the same layout from a built binary.
# The toolchain link-order.txt was made with (its symbol names are this rustc's; with
# another the build works and the code keeps the compiler's own order).
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Recorded as aether_build_info{commit=...} when given:
# docker build --build-arg AETHER_GIT_COMMIT="$(git rev-parse HEAD)" .
ARG AETHER_GIT_COMMIT=
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin aether-edge \
 && strip -o /aether-edge target/release/aether-edge

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /aether-edge /usr/local/bin/aether-edge
# 65532 is distroless's "nonroot"; the chart's securityContext asks for the same.
USER 65532:65532
# Internal ports (20000-29999 by default) and the admin port are unprivileged, so the
# image needs no capabilities.
EXPOSE 9901
ENTRYPOINT ["/usr/local/bin/aether-edge"]
CMD ["run", "--kubernetes"]
