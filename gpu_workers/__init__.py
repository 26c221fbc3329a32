"""GPU worker side of the dynamic-batching service: model specs and batch runners."""
