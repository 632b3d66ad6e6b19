/* A stand-in for libnccl.so.2 with the C API memo-nccl calls, compiled by tests/fake_library.rs
 * with gcc (the test SKIPs without it). It checks what it is handed (the config prefix's size,
 * magic, version and blocking; the unique id's bytes, passed by value; enum values) and answers
 * by rank, so that the binding's symbol resolution, version check, polling, timeout, abort and
 * error mapping run for real without a GPU:
 *   rank 0: joins after two polls; collectives check their arguments and complete after one poll
 *   rank 1: never joins (ncclInProgress forever): the join timeout
 *   rank 2: ncclCommInitRankConfig fails at once with ncclSystemError and a last error
 *   rank 3: joins, then reports ncclRemoteError from ncclCommGetAsyncError
 * Counters (fake_counts) say how often each communicator call ran.
 *
 * -DFAKE_VERSION=<code> sets ncclGetVersion's code (default 22703); -DFAKE_NO_CONFIG leaves out
 * ncclCommInitRankConfig (as NCCL before 2.14 does); -DFAKE_GROUP_IN_PROGRESS makes ncclGroupEnd
 * return ncclInProgress (as on a non-blocking communicator). */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

#ifndef FAKE_VERSION
#define FAKE_VERSION 22703
#endif

typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6,
       ncclInProgress = 7 };

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { size_t size; unsigned int magic; unsigned int version; int blocking; } ncclConfigPrefix;

struct ncclComm { int rank; int nranks; int polls; int pending; };
typedef struct ncclComm* ncclComm_t;

static char last_error[256] = "";
static int counts[8]; /* init, abort, finalize, destroy, group start, group end, collectives, polls */
static struct { size_t count; int datatype; int op; void* stream; const void* send; void* recv; } last_call;

static void set_last(const char* text) { strncpy(last_error, text, sizeof(last_error) - 1); }

void fake_counts(int* out) { memcpy(out, counts, sizeof(counts)); }
void fake_last_call(size_t* count, int* datatype, int* op, void** stream, const void** send, void** recv) {
  *count = last_call.count; *datatype = last_call.datatype; *op = last_call.op; *stream = last_call.stream;
  *send = last_call.send; *recv = last_call.recv;
}

ncclResult_t ncclGetVersion(int* version) { *version = FAKE_VERSION; return ncclSuccess; }

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "fake: unhandled system error";
    case ncclInvalidArgument: return "fake: invalid argument";
    case ncclInvalidUsage: return "fake: invalid usage";
    case ncclRemoteError: return "fake: remote process exited or there was a network error";
    case ncclInProgress: return "fake: operation in progress";
    default: return "fake: unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) { (void)comm; return last_error; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 3 + 1);
  return ncclSuccess;
}

#ifndef FAKE_NO_CONFIG
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfigPrefix* config) {
  counts[0]++;
  if (config == NULL || config->size < sizeof(ncclConfigPrefix) || config->magic != 0xcafebeef ||
      config->version < 21400 || config->blocking != 0) {
    set_last("fake: config is not a non-blocking ncclConfig_t prefix");
    return ncclInvalidArgument;
  }
  for (int i = 0; i < 128; i++) {
    if (id.internal[i] != (char)(i * 3 + 1)) {
      set_last("fake: the unique id's bytes were not passed by value intact");
      return ncclInvalidArgument;
    }
  }
  if (rank < 0 || rank >= nranks) { set_last("fake: rank out of range"); return ncclInvalidArgument; }
  if (rank == 2) { set_last("fake: socket connect to the bootstrap root failed"); return ncclSystemError; }
  struct ncclComm* c = calloc(1, sizeof(struct ncclComm));
  c->rank = rank; c->nranks = nranks; c->pending = rank == 1 ? -1 : 2;
  *comm = c;
  return ncclInProgress;
}
#endif

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  counts[7]++;
  if (comm->pending < 0) { *state = ncclInProgress; return ncclSuccess; }
  if (comm->pending > 0) { comm->pending--; *state = ncclInProgress; return ncclSuccess; }
  if (comm->rank == 3 && comm->polls++ > 0) { set_last("fake: peer 1 closed the connection"); *state = ncclRemoteError; return ncclSuccess; }
  *state = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { counts[1]++; free(comm); return ncclSuccess; }
ncclResult_t ncclCommFinalize(ncclComm_t comm) { counts[2]++; comm->pending = 1; return ncclInProgress; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { counts[3]++; free(comm); return ncclSuccess; }
ncclResult_t ncclGroupStart(void) { counts[4]++; return ncclSuccess; }
#ifdef FAKE_GROUP_IN_PROGRESS
ncclResult_t ncclGroupEnd(void) { counts[5]++; return ncclInProgress; }
#else
ncclResult_t ncclGroupEnd(void) { counts[5]++; return ncclSuccess; }
#endif

static ncclResult_t collective(const void* send, void* recv, size_t count, int datatype, int op, ncclComm_t comm,
                               void* stream) {
  counts[6]++;
  last_call.count = count; last_call.datatype = datatype; last_call.op = op; last_call.stream = stream;
  last_call.send = send; last_call.recv = recv;
  if (send == NULL || recv == NULL) { set_last("fake: a null buffer"); return ncclInvalidArgument; }
  if (datatype != 1 && datatype != 3 && datatype != 7 && datatype != 9) { set_last("fake: data type"); return ncclInvalidArgument; }
  if (op != -1 && op != 0 && op != 2) { set_last("fake: reduction"); return ncclInvalidArgument; }
  comm->pending = 1;
  return ncclInProgress;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, int datatype, ncclComm_t comm, void* stream) {
  return collective(send, recv, count, datatype, -1, comm, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, int datatype, int op, ncclComm_t comm,
                               void* stream) {
  return collective(send, recv, count, datatype, op, comm, stream);
}
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int datatype, int op, ncclComm_t comm,
                           void* stream) {
  return collective(send, recv, count, datatype, op, comm, stream);
}
