"""The session server: a process that owns one session (`server`), what its clients may ask of it (`service`),
what crosses between them (`protocol`), where this user's sessions are found (`registry`), the warm interpreter
that forks servers (`zygote`), and the client half with the same public API as a `Session` (`client`), which
`forge_nb.up` and `forge_nb.attach` return."""
