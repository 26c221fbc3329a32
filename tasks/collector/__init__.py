"""The batch collector: takes requests, forms batches with tasks.core, sends them to the devices."""
