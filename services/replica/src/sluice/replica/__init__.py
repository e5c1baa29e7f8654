"""The replica service: one model on one device. A thin gRPC servicer over
an engine loop that owns the model thread; the loop runs the pure engine
core (sluice.engine) and the torch model runner (sluice.model)."""
