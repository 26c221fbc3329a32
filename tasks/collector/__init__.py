"""The batch collector: takes requests, forms batches with dynamic_batching.core, sends them to the devices."""
