"""The dashboard at /ui/: server-rendered pages whose small scripts read and change
everything through the public /v1 API (so a page shows what the CLI shows), signed in
with an API key kept in a session cookie (service.http.auth)."""
