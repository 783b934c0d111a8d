"""The adapters: the only code that speaks to RabbitMQ (``bus``) and Postgres
(``store``). Everything above them decides by casetrail's own error kinds
(``casetrail.errors``), never by a library's exception."""
