"""The unit tier: no broker, no database, no browser, no root, no network and no tool
beyond the installed package (`make test-unit`, under a minute). What needs promtool or
Go runs in the integration tier."""
