#!/bin/sh
# Runs a command in a network namespace of its own whose only interface is the loopback, when
# we may create one (root, unshare present): whatever the test binds stays private to it and
# no two tests can collide on a port. Elsewhere the command runs as is (tests then use
# cpprun --standalone, which picks a free loopback port).
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 \
   && unshare -n true 2>/dev/null; then
  exec unshare -n sh -c 'ip link set lo up && exec "$@"' sh "$@"
fi
exec "$@"
