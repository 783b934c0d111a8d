"""The browser tier: the viewer in Debian's Chromium, on a stack of its own."""
