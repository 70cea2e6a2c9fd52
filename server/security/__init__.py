"""The broker's security: TLS listeners, authentication, per-topic permissions (issue 18).

| module       | its one job                                                              |
|--------------|--------------------------------------------------------------------------|
| ``config``   | the ``[security]``, ``[user=NAME]`` and ``[anonymous]`` sections          |
| ``passwords``| scrypt password hashes (``pymetaq security hash-password``), verification |
| ``acl``      | identities and their rights; the exact 403 texts                          |
| ``tls``      | the server's ``ssl.SSLContext`` and the identity in a client certificate |
| ``guard``    | per-connection checks run by the dispatcher, the ``auth`` verb, rate limit |

With the default configuration (no ``[security]`` section) nothing changes for MetaQ's clients.
"""
