"""Model servers for tests and local use, the only test doubles the project allows
(docs/architecture.md, "Modules")."""
