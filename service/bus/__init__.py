"""RabbitMQ adapters: the topology, the one place that publishes, and message codecs.

Importing the package makes every aiormq connection read its frames with
``service.bus.receiver`` (see there why).
"""

from service.bus import receiver

receiver.install()
