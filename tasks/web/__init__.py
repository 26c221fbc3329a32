"""Pages and the JSON API: thin translations of HTTP into calls on dynamic_batching.edge and the store."""
