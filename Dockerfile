# tessera's container image, in two stages.
#
# 1. Build the release binary with the Rust toolchain.
# 2. Copy it, and the shipped policies, onto a distroless base: glibc and CA
#    certificates, no shell, no package manager, running as uid 65532.
#
# Configuration comes from the environment (see docker-compose.yml):
# TESSERA_DATABASE_URL_FILE and TESSERA_MASTER_KEY_FILE name mounted secret
# files, so no secret is in the image, the environment or the compose file.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin tessera

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/tessera /usr/local/bin/tessera
COPY --from=build /src/policies /etc/tessera/policies
ENV TESSERA_LISTEN=0.0.0.0:7470 \
    TESSERA_POLICIES=/etc/tessera/policies \
    TESSERA_DATA_DIR=/tmp/tessera
USER 65532:65532
EXPOSE 7470
ENTRYPOINT ["/usr/local/bin/tessera"]
CMD ["serve"]
