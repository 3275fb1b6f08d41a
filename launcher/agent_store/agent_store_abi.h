/* The C interface of libcpprun_agent_store.so, the LibTorch part of cpprun that hosts and reads the
 * c10d TCPStore of a multi-node job. C, so that the launcher, which links no LibTorch, can dlopen()
 * it only when --nnodes > 1 and never sees a C++ exception or a LibTorch type. */
#pragma once

#include <stddef.h>

extern "C" {

/* Bumped whenever the table below changes; the launcher refuses a library with another one. */
#define CPPRUN_AGENT_STORE_ABI_VERSION 3

typedef struct cpprun_agent_store cpprun_agent_store;

/* A failing call leaves a NUL-terminated message in err. */
typedef struct cpprun_agent_store_api {
  int abi_version; /* first in every version, so that a mismatch can be told */
  /* With is_server: starts a c10d TCPStore server on `port` (on `host`, numeric, alone with loopback_only,
   * else on all interfaces, as c10d does) and connects to it; otherwise connects to host:port.
   * `timeout_ms` bounds the connection and every later get(). NULL on failure. */
  cpprun_agent_store* (*open)(const char* host, int port, int is_server, int loopback_only, long timeout_ms,
                              char* err, size_t err_size);
  /* 0 on success, -1 on failure. */
  int (*set)(cpprun_agent_store* store, const char* key, const char* value, char* err, size_t err_size);
  /* Waits (up to the store's timeout) for `key`, then copies its value, NUL-terminated and cut to
   * value_size - 1 bytes. 0 on success, -1 on failure. */
  int (*get)(cpprun_agent_store* store, const char* key, char* value, size_t value_size, char* err, size_t err_size);
  /* Closes the connection; a server stops serving and frees its port. */
  void (*close)(cpprun_agent_store* store);
} cpprun_agent_store_api;

/* The library's one entry point. */
const cpprun_agent_store_api* cpprun_agent_store_get_api(void);
}
