"""Fakes of real providers that speak their documented wire format over real HTTP (or IMAP),
for the provider reconcilers' tests: the real paths, query parameters, bodies, status codes,
pagination and rate limiting. Each records what it was asked, headers included, so a test can
check the credential was sent."""
