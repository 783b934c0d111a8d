"""Personal data: kept out of every event and every log line.

Fields marked ``Sensitive`` become placeholders in events and are stored encrypted
under a per-case key that erasing a case destroys (``sensitive``); the values a tool
call needs travel sealed to that capability's own key (``sealing``, HPKE).
"""
