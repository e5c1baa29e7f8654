"""gRPC plumbing shared by every Sluice service: the server lifecycle with
grpc.health.v1, the mapping of domain errors to status codes, and client
channel helpers. The generated stubs live beside this package in sluice.v1."""
