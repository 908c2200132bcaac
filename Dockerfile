# Build: docker build -t nodegroup-operator .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
# The cloud API clients are crates of the workspace.
COPY crates crates
# The workspace lists the sandbox crate; only the operator binary is built and shipped.
COPY sandbox sandbox
RUN cargo build --release --locked -p nodegroup-operator --bin nodegroup-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/nodegroup-operator /usr/local/bin/nodegroup-operator
USER 65532:65532
EXPOSE 8086 8080
ENTRYPOINT ["/usr/local/bin/nodegroup-operator"]
CMD ["run"]
