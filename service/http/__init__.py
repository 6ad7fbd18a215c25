"""What the platform's HTTP apps (the API, service.api, and the scoring service,
service.scoring) share: installation of the common middleware and error handlers, stable
operation ids, the caller's key, problem+json, body limits and health."""
