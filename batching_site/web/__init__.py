"""Pages and the JSON API: thin translations of HTTP into calls on tasks.edge and the store."""
