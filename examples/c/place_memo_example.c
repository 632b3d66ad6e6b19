/*
 * Places the MEMO paper's one-layer memory request trace (docs/technique.md section 2,
 * examples/traces/memo-layer.trace) through memo's C ABI, then the layer's forward and backward
 * transients on their own, as MEMO's level-1 planning does, and prints the peaks. Given a plan
 * file as well (as `memo plan ... -o plan.memo` writes it), loads it, checks it with the
 * independent checker and prints its totals and one buffer of each kind.
 *
 * Build and run from the repository root (memo-capi/tests/c_example.rs does the same):
 *   cargo build -p memo-capi
 *   cc -std=c99 -Wall -Wextra -I memo-capi/include examples/c/place_memo_example.c \
 *      -L target/debug -lmemo_capi -Wl,-rpath,target/debug -o place_memo_example
 *   (with CARGO_TARGET_DIR set, the library is in $CARGO_TARGET_DIR/debug instead)
 *   ./place_memo_example examples/traces/memo-layer.trace [plan.memo]
 *
 * Expected: the whole layer 2432 MB, the forward transients 512 MB, the backward transients
 * 1920 MB, each equal to its lower bound (so proven optimal, zero fragmentation).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memo.h"

#define MB 1000000ULL

/* Prints what failed and why; returns 1 so that callers can `return fail(...)`. */
static int fail(MemoStatus status, const char *what) {
    fprintf(stderr, "%s failed: %s: %s\n", what, memo_status_name(status), memo_last_error());
    return 1;
}

/* Reads a whole file into a malloc'd buffer (the caller frees it); NULL on failure. */
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return NULL;
    size_t capacity = 4096, used = 0;
    unsigned char *data = malloc(capacity);
    while (data != NULL) {
        used += fread(data + used, 1, capacity - used, file);
        if (used < capacity) break;
        unsigned char *grown = realloc(data, capacity * 2);
        if (grown == NULL) { free(data); data = NULL; break; }
        data = grown;
        capacity *= 2;
    }
    fclose(file);
    *len = used;
    return data;
}

/* Prints one line about `placement`, and its buffers' offsets when `show_buffers`. */
static int print_placement(const MemoPlacement *placement, const char *label, int show_buffers) {
    MemoPlacementSummary summary;
    MemoStatus status = memo_placement_summary(placement, &summary);
    if (status != MEMO_STATUS_OK) return fail(status, label);
    printf("%s: %llu buffers, peak %llu MB, lower bound %llu MB, %s\n", label,
           (unsigned long long)summary.buffers, (unsigned long long)(summary.peak / MB),
           (unsigned long long)(summary.lower_bound / MB),
           summary.optimal ? "proven optimal" : "not proven optimal");
    for (size_t i = 0; show_buffers && i < summary.buffers; i++) {
        MemoPlacedBuffer buffer;
        status = memo_placement_buffer(placement, i, &buffer);
        if (status != MEMO_STATUS_OK) return fail(status, label);
        printf("  tensor %2llu: %4llu MB at offset %4llu MB, alive over requests [%u, %u)\n",
               (unsigned long long)buffer.id, (unsigned long long)(buffer.size / MB),
               (unsigned long long)(buffer.offset / MB), buffer.lower, buffer.upper);
    }
    return 0;
}

/* Places `trace` (minimising the peak) and prints the placement. */
static int place_and_print(const MemoTrace *trace, const char *label, int show_buffers) {
    MemoPlacement *placement = NULL;
    MemoStatus status = memo_place(trace, NULL, &placement);
    if (status != MEMO_STATUS_OK) return fail(status, label);
    int failed = print_placement(placement, label, show_buffers);
    memo_placement_free(placement);
    return failed;
}

/* One request of a hand-built trace. */
struct request {
    int is_malloc;
    unsigned long long id, megabytes;
};

/* Builds a trace from `requests`, places it and prints it. */
static int place_requests(const struct request *requests, size_t count, const char *label) {
    MemoTrace *trace = NULL;
    MemoStatus status = memo_trace_new(&trace);
    if (status != MEMO_STATUS_OK) return fail(status, "memo_trace_new");
    for (size_t i = 0; i < count; i++) {
        const struct request *r = &requests[i];
        status = r->is_malloc ? memo_trace_add_malloc(trace, r->id, r->megabytes * MB)
                              : memo_trace_add_free(trace, r->id, r->megabytes * MB);
        if (status != MEMO_STATUS_OK) {
            memo_trace_free(trace);
            return fail(status, label);
        }
    }
    int failed = place_and_print(trace, label, 0);
    memo_trace_free(trace);
    return failed;
}

/* Loads the plan file at `path`, checks it, prints its totals and the first buffer of each kind. */
static int print_plan(const char *path) {
    MemoPlan *plan = NULL;
    MemoStatus status = memo_plan_load_file(path, &plan);
    if (status != MEMO_STATUS_OK) return fail(status, "memo_plan_load_file");
    status = memo_plan_check(plan);
    if (status != MEMO_STATUS_OK) {
        /* Not safe to run: list why, as `memo check` does. */
        fprintf(stderr, "%s: %s\n", memo_status_name(status), memo_last_error());
        size_t violations = 0;
        memo_plan_violation_count(plan, &violations);
        char text[512];
        for (size_t i = 0; i < violations && i < 10; i++) {
            if (memo_plan_violation(plan, i, text, sizeof text, NULL) == MEMO_STATUS_OK)
                fprintf(stderr, "  %s\n", text);
        }
        memo_plan_free(plan);
        return 1;
    }
    MemoPlanTotals totals;
    MemoPlanProvenance provenance;
    size_t buffers = 0, instructions = 0;
    char model[64];
    if ((status = memo_plan_totals(plan, &totals)) != MEMO_STATUS_OK ||
        (status = memo_plan_provenance(plan, &provenance)) != MEMO_STATUS_OK ||
        (status = memo_plan_buffer_count(plan, &buffers)) != MEMO_STATUS_OK ||
        (status = memo_plan_instruction_count(plan, &instructions)) != MEMO_STATUS_OK ||
        (status = memo_plan_model_name(plan, model, sizeof model, NULL)) != MEMO_STATUS_OK) {
        memo_plan_free(plan);
        return fail(status, path);
    }
    printf("plan: valid; model %s, %u layers, %llu tokens, strategy %s, alpha %.3f (bound: %s)\n", model,
           provenance.layers, (unsigned long long)provenance.seq_len, provenance.strategy, provenance.alpha,
           provenance.alpha_bound);
    printf("plan: %zu buffers, %zu instructions\n", buffers, instructions);
    printf("plan: arena %llu bytes (lower bound %llu), host %llu bytes, parameters %llu bytes, rounding buffers %llu bytes\n",
           (unsigned long long)totals.arena_bytes, (unsigned long long)totals.arena_lower_bound_bytes,
           (unsigned long long)totals.host_bytes, (unsigned long long)totals.parameter_bytes,
           (unsigned long long)totals.rounding_buffer_bytes);
    /* The first buffer of each kind (kinds are static strings: compare them by content). */
    const char *seen[16];
    size_t kinds = 0;
    for (size_t i = 0; i < buffers; i++) {
        MemoPlanBuffer buffer;
        if ((status = memo_plan_buffer(plan, i, &buffer)) != MEMO_STATUS_OK) {
            memo_plan_free(plan);
            return fail(status, "memo_plan_buffer");
        }
        int known = 0;
        for (size_t k = 0; k < kinds; k++) known |= strcmp(seen[k], buffer.kind) == 0;
        if (known || kinds == sizeof seen / sizeof seen[0]) continue;
        seen[kinds++] = buffer.kind;
        printf("  buffer %4zu: %-15s %-22s layer %2lld, %6llu rows x %5llu bytes = %8llu bytes, %s offset %llu\n", i,
               buffer.kind, buffer.role, (long long)buffer.layer, (unsigned long long)buffer.rows,
               (unsigned long long)buffer.row_bytes, (unsigned long long)buffer.bytes,
               buffer.place == MEMO_PLACE_DEVICE ? "arena" : "host", (unsigned long long)buffer.offset);
    }
    return memo_plan_free(plan) == MEMO_STATUS_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "examples/traces/memo-layer.trace";
    size_t len = 0;
    unsigned char *text = read_file(path, &len);
    if (text == NULL) {
        fprintf(stderr, "cannot read %s (pass the path of memo-layer.trace)\n", path);
        return 1;
    }
    MemoTrace *layer = NULL;
    MemoStatus status = memo_trace_parse(text, len, &layer);
    free(text);
    if (status != MEMO_STATUS_OK) return fail(status, path);
    int failed = place_and_print(layer, "whole layer", 1);

    /* A capacity below the lower bound is refused, with a proof. */
    MemoPlaceOptions options = memo_place_options_default();
    options.capacity = 2000 * MB;
    MemoPlacement *placement = NULL;
    status = memo_place(layer, &options, &placement);
    printf("whole layer under 2000 MB: %s (%s)\n", memo_status_name(status), memo_last_error());
    if (status == MEMO_STATUS_OK) memo_placement_free(placement);
    memo_trace_free(layer);

    /* MEMO's level 1: the transients of the forward (13, 14, 17, 18, 19) and of the backward
       (20-24) placed on their own; the skeletal tensors 15 and 16 are left out. */
    static const struct request forward[] = {
        {1, 13, 128}, {1, 14, 128}, {0, 14, 128}, {0, 13, 128}, {1, 17, 128},
        {1, 18, 128}, {1, 19, 256}, {0, 17, 128}, {0, 19, 256}, {0, 18, 128},
    };
    static const struct request backward[] = {
        {1, 20, 512}, {0, 20, 512}, {1, 21, 1024}, {1, 22, 256}, {1, 23, 128},
        {1, 24, 512}, {0, 21, 1024}, {0, 22, 256}, {0, 23, 128}, {0, 24, 512},
    };
    failed |= place_requests(forward, sizeof forward / sizeof forward[0], "forward transients");
    failed |= place_requests(backward, sizeof backward / sizeof backward[0], "backward transients");
    if (argc > 2) failed |= print_plan(argv[2]);
    return failed;
}
