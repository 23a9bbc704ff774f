"""Generated protobuf and gRPC modules for rollmesh.v1 (do not edit; `make protos`)."""

