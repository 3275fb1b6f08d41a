# Runs the command given where this host has IPv6 on its loopback (::1); elsewhere exits 77, which
# ctest counts as a skip (SKIP_RETURN_CODE), saying why, instead of a pass with nothing tested.
# usage: ipv6_or_skip.sh COMMAND...
if ! grep -qi '^00000000000000000000000000000001 ' /proc/net/if_inet6 2>/dev/null; then
  echo "SKIP: no ::1 on this host's loopback (IPv6 disabled): the IPv6 half of node_link is not tested"
  exit 77
fi
exec "$@"
