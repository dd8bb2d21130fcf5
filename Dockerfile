# Multi-stage build: compile in the Rust image, run from a small image with
# no shell as a non-root user. The data dir is a volume.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
RUN cargo build --release --locked --bin tessera

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/tessera /usr/local/bin/tessera
ENV TESSERA_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 7470
USER nonroot
ENTRYPOINT ["/usr/local/bin/tessera"]
# Inside a container, listen on all interfaces; publish the port only to
# the networks that need it.
CMD ["serve", "--listen", "0.0.0.0:7470"]
