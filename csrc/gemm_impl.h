/* The GEMM (dtype and ISA template; needs dtype.h, simd.h and storage.h): a register-
 * blocked micro-kernel, and BLIS-style packing and blocking around it.
 *
 *   C (M, N) = bias (N) + A (M, K) . B (N, K)^T
 *
 *   for each block of KC steps of K, in order:
 *     pass 1 (parallel): pack A into MR-row slivers and B into NR-row
 *                        slivers, zero-padded to whole slivers
 *     pass 2 (parallel): one task per block of C (MC rows, NC columns):
 *       for each B sliver (KC, NR) of the block:
 *         for each A sliver (KC, MR) of the block, all in L2:
 *           micro-kernel: C tile (MR, NR) += A sliver^T . B sliver
 *   (with one column block, each task packs its own A block in pass 2)
 * Three other orders by the size of A. Up to GEMM_FEW_ROWS rows (a decode
 * step), "few rows" (B's rows contiguous): nothing packed, B's rows read in
 * place and turned in registers, all of A's rows multiplied at once (at
 * AVX2's width, from GEMM_FEW_ROWS_IN_LANES_FROM rows, A's rows in a
 * vector's lanes instead and B's elements broadcast). A few
 * dozen rows (a short sequence), "transposed" (float and double only):
 * C^T = B . A^T, B (the weights) read in place and only A packed, the
 * tiles of C^T written to a panel a thread and turned into C every
 * GEMM_PANEL_ROWS rows; an A that
 * stays in cache (GEMM_STREAMED_A_BYTES), and B slivers for every thread,
 * "streamed": each task of pass 2 packs its B slivers one at a time and
 * multiplies all of A by each (on Intel at AVX-512 an A far beyond L2
 * too, by blocks of slivers, where the blocked order would cut C into
 * column blocks: GEMM_FAR_A_BY_B_BLOCKS), so the weights are
 * read once and never written back packed; at AVX2 and AVX-512, A's
 * whole slivers are read in place (rows of reals with unit column
 * stride), and only a last partial
 * one is packed (else all of A is). In both, on up to
 * GEMM_OWN_COPY_THREADS threads, each thread packs what it packs of the
 * small operand in a copy of its own instead of sharing one. B may come
 * packed already, for all of K (packed_b, from pack_weights: a frozen
 * module's weights), and then the blocked and streamed orders read its
 * slivers there and pack none of B, at any M. The first K
 * block starts the sums from the bias (or zeros) and stores them: C is never
 * cleared or re-read just to add the bias. Each
 * element of C adds up its K blocks in the same order whatever task, thread
 * or tile computes it, and the small-problem loops (gemm_direct) and the few
 * rows order repeat that order with the same fused multiply-add, so a row's
 * bits never depend on M.
 * For the 16-bit dtypes, A and B are widened as they are packed, C is summed
 * in a float buffer and rounded once at the end, so every element gets
 * exactly the float GEMM's sum of the widened operands; but where BF16_PAIRS
 * (bfloat16 at the AVX512_BF16 level), they are packed as pairs of bfloat16
 * along K and multiplied by vdot_pairs, every product through the packed path
 * (no direct loops or few rows), so that a row's bits still never depend on
 * M.
 */
#ifndef ATTNC_GEMM_CONSTANTS
#define ATTNC_GEMM_CONSTANTS
/* The packed A block (MC, ATTNC_GEMM_KC) of a task: 192 KB, so it stays
 * in L2 while every B sliver of the task passes over it: MC = 48 rows of
 * float, 24 of double (twice that measured no faster). */
#define GEMM_A_BLOCK_BYTES (192 * 1024)
/* Up to this much packed A (per K block), the streamed order, whose
 * premise is that A stays close while the B slivers pass: in L2 up to 1 MB
 * (a Zen 4 or 5 core's; 1.25 MB on Ice Lake, where 1 MB took 0.91-1.00x
 * the blocked order's time on 1 thread and 0.94-1.07x on 2), in L3 beyond.
 * On Zen 4, 2 MB instead of 1: `linear` (512, 768, 2304) 0.97x the time on
 * 1 and 2 threads, (600, 768, 3072) 0.97x, (400, 1024, 1024) 0.84x, module
 * (1, 512, 768) 0.91-0.98x; at 4 MB (1024, 1024, 1024) was 1.015x.
 * 3 MB at AVX-512 since A is read in place there (GEMM_STREAMED_A_IN_PLACE;
 * its rows multiply each 32-column B sliver): module (8, 128, 512) 0.98x
 * on 1 and 2 threads, `linear` (1024, 512, 512) 0.94-0.97x, (768, 768,
 * 2304) 0.95x / 0.98x (1 / 2 threads); at 4 MB (1024, 1024, 1024) 1.03x. Not
 * at AVX2, whose 16-column slivers read A twice as often: (2048, 256, 768)
 * 1.10x, (1024, 512, 512) 1.08x on 2 threads (benchmarks/NOTES.md). Zen's
 * L3 is near (a core complex's); on Intel's server cores A beyond L2
 * comes across a mesh, and there 1.25 MB at AVX-512
 * (GEMM_STREAMED_A_BYTES_FAR_L3): on a Xeon family 6 model 207 (2 MB of
 * L2), against 3 MB (best blocks), 1 MB took 0.72-0.96x the time of
 * `linear` (1024, 512) -> 1536 on 1 thread and 0.71-0.80x on 2, (1024,
 * 512) -> 512 0.74-0.88x and 0.72-0.87x, (512, 768) -> 2304 0.89-0.93x,
 * module (8, 128, 512) 0.85-0.94x on 2 threads, (1, 512, 768) 0.75-0.93x,
 * but (256, 1024) -> 3072 (1.08 MB of A) 1.06-1.07x, module (1, 256, 1024)
 * 1.15x; 512 KB (256, 768) -> 2304 1.12x on 1 thread. Taken for every
 * Intel core at AVX-512 (Ice Lake-SP had measured 1 MB as well; client
 * cores, whose L3 is a ring, not measured) (benchmarks/NOTES.md). */
#define GEMM_STREAMED_A_BYTES ((SIMD_BYTES == 64 ? 3 : 2) * 1024 * 1024)
#define GEMM_STREAMED_A_BYTES_FAR_L3 (SIMD_BYTES == 64 ? 5 * 256 * 1024 : GEMM_STREAMED_A_BYTES)
/* Tasks per thread of a streamed pass 2 (a task per column block of B),
 * when B has the slivers; with fewer than two slivers a thread, the
 * blocked order splits the rows instead. */
#define GEMM_STREAMED_TASKS 4
/* On Intel's server cores at AVX-512, an A of more than
 * GEMM_STREAMED_A_BYTES is streamed too, by blocks of B slivers: each task
 * packs up to this much of its slivers (they stay in L2) and multiplies A,
 * from L3, by them a sliver of A at a time, so A is read once a block, not
 * once a sliver. The blocked order had packed all of B for every task
 * into memory, written and read back from L3 (12 MB for a (1024, 1024) x
 * (3072, 1024)^T product). On a Xeon family 6 model 167, 2 threads, 15
 * rounds, best / median: `linear` (4096, 768) -> 768 0.92 / 0.89x the
 * time, (2048, 1024) -> 4096 0.95 / 0.95x, (1024, 1024) -> 3072 0.98 /
 * 0.97x, modules (4, 256, 1024) 0.97 / 0.95x, (8, 512, 768) 0.95 / 0.96x;
 * frozen 0.98x. Between GEMM_STREAMED_A_BYTES_FAR_L3 and 3 MB the blocked
 * order stays: blocks took 0.99-1.03x at (1024, 512) -> 1536 and 1.02-1.08x
 * at module (8, 128, 512). Blocks of 1 MB and 256 KB, packed copies of A,
 * a task per block: no better (benchmarks/NOTES.md). Not measured on other
 * CPUs or levels, which keep the blocked order. */
#define GEMM_FAR_A_BY_B_BLOCKS (SIMD_BYTES == 64)
#define GEMM_STREAMED_B_BLOCK_BYTES (512 * 1024)
/* A far A that cannot be read in place (rows 4 KB apart) is packed whole
 * into a copy a thread (GEMM_OWN_COPY_THREADS): each thread packs all of
 * it, and reads its copy back from memory once a block of slivers. Beyond
 * this much (per K block) the blocked order, which packs A once, by blocks
 * that stay in L2: on a Xeon family 6 model 207, 2 threads, 5 rounds,
 * best / median, blocked against far-x `linear` K = 1024: M = 1024 1.07 /
 * 1.10x the time at N = 768, 1.24 / 1.13x at 3072; M = 2048 (8 MB of A)
 * 0.92-1.15 / 0.87-1.14x; M = 4096 0.93-0.97 / 0.83-0.97x; M = 8192
 * 0.77-0.90 / 0.68-0.89x; M = 65536, N = 256 0.58 / 0.59x (and faster than
 * torch's there, where far-x had been 1.5x its time). An A read in place
 * (K = 512, 768) kept far-x: mixed, 0.87-1.15x (benchmarks/NOTES.md). */
#define GEMM_FAR_A_COPY_BYTES (8 * 1024 * 1024)
/* Up to this many threads, each thread packs the small operand (A
 * streamed, B transposed), which every one of its tasks multiplies, for
 * itself, into its own copy, instead of the threads packing one shared
 * copy in a pass of their own: a line of the shared copy that the other
 * core had read in the call before had to be taken back from it before
 * being written, and on 2 Zen 4 threads that pass took twice one thread's
 * time to pack it all (22.7 us against 11.5 for a (256, 256) A). Own
 * copies: `linear` (256, 256, 256) 0.92x the time, (32, 256, 256) 0.86x,
 * modules (1, 32, 256) 0.95x, (2, 128, 256) 0.98x. Measured at 2 threads
 * only; at n threads the shared pass would cost about 4 / n of one
 * thread's packing, so own copies stop paying at 4. */
#define GEMM_OWN_COPY_THREADS 3
/* NC: columns of C per task at most. BLIS sizes NC (4080) to keep a B panel in L3;
 * here (the blocked order) B is packed once per K block for all tasks, so a narrower task costs
 * only re-reading its A block from L3, and narrow tasks balance threads:
 * a (768, 2304) float C is 16 x 5 tasks. */
#define GEMM_NC 512
/* Up to this many multiply-adds, packing costs more than it saves: C is
 * computed by direct loops with no workspace (e.g. the documents' tiny
 * examples). */
#define GEMM_DIRECT_MAX_MACS (20 * 20 * 20)
/* Up to GEMM_FEW_ROWS rows of A (a decode step's projections, a short
 * prompt's), gemm_few_rows, in GEMM_FEW_ROWS_TASKS tasks a thread.
 * VLANES / 2 rows: 8 floats at AVX-512, where (8, 256) x (768, 256)^T took
 * 0.62-0.67x the transposed order's time on an Ice Lake core, 12 rows 0.88x
 * and 14 1.02x; 4 for AVX-512's doubles (6 rows 0.78x, 8 1.04x); 2 at the
 * 16-byte portable level (4 rows 0.73x). VLANES at AVX2, since A is laid
 * out step-major (one pointer for its broadcasts) and each few_rows_block
 * copy loads by blocks or whole vectors, not both: on a Zen 3 core, 1
 * thread, against the packed order, float (8, 768) -> 2304 0.73x the time,
 * 6 rows 0.65x, 5 0.58x, (8, 1024) -> 1024 0.83x, (8, 1024) -> 4096 0.81x;
 * double (4, 768) -> 2304 0.62-0.70x, 3 rows 0.63-0.65x, where 5 to 8 rows
 * (two vectors' lanes) took 1.09-1.55x (benchmarks/NOTES.md). */
#define GEMM_FEW_ROWS (SIMD_BYTES == 32 ? VLANES : VLANES / 2)
#define GEMM_FEW_ROWS_TASKS 4
/* On Intel, from this many bytes of weights a thread computing the product
 * (attnc_threads_for: one inside a task; more than its core's
 * L2 holds, so they come from L3 each call), the few-rows order asks for
 * the next block's VLANES rows (contiguous: one run of memory) while it
 * multiplies a block, a VLANES x VLANES turn's worth of lines a step, in
 * the order they lie (few_rows_block's next_rows): a block reads its rows
 * side by side, VLANES streams the prefetchers follow less well than one.
 * On a Xeon family 6 model 167 at AVX-512, 2 threads, the same bits, best
 * / median: `linear` (1, 768) -> 2304 0.90-1.00x / 0.91-1.00x the time
 * (four of five runs 0.91-0.95x), (2, 768) -> 2304 0.91-0.98 / 0.92-0.97x,
 * (1, 1024) -> 3072 0.96-1.04 / 0.96-1.00x; 3 to 5 rows 0.98-1.0x, so
 * up to GEMM_FEW_ROWS_PREFETCH_MAX_ROWS rows (a copy of
 * few_rows_block of its own: asked at run time in every copy, it cost 3
 * and 4 rows 1.10-1.12x where it never asked). Not where the weights a
 * thread's L2 holds ((1, 1024) -> 1024 and (4, 1024) -> 1024 1.07-1.21x),
 * nor past GEMM_FEW_ROWS_PREFETCH_TO_BYTES a thread ((1, 4096) -> 4096,
 * from DRAM: 0.98-1.02x, bench.py's 5-d2 1.02x; (1, 2048) -> 8192 0.98x),
 * nor with loads by blocks (6 rows: 1.30x) (benchmarks/NOTES.md). */
#define GEMM_FEW_ROWS_PREFETCH_FROM_BYTES (2 * 1024 * 1024)
#define GEMM_FEW_ROWS_PREFETCH_TO_BYTES (16 * 1024 * 1024)
#define GEMM_FEW_ROWS_PREFETCH_MAX_ROWS 2
/* Blocks of VLANES outputs the few-rows order takes side by side for one
 * row of A (few_rows_block), where their rows are loaded by blocks: alone,
 * a block's sums are one chain of multiply-adds, each waiting on the last.
 * At AVX2 two: on a Zen 3 core, `linear` (1, 768) -> 2304 took 0.76x the
 * time on 1 thread and 0.82x on 2, (1, 1000) -> 1000 0.80x, doubles 0.70-
 * 0.75x, a module's decode step (1, 1, 768) 0.76x; rows 4 KB apart (loaded
 * whole, not by blocks) took 1.28-1.32x, so they stay one block at a time.
 * AVX-512's 16 x 16 turns spilled with two blocks in a C probe on Zen 4
 * (1.1-1.3x slower: benchmarks/NOTES.md). */
#define FEW_ROWS_CHAINS (SIMD_BYTES == 32 ? 2 : 1)
/* The few-rows order addresses a block's weight rows from a base per four
 * rows (row_of) when they are evenly spaced and a vector holds more than 8
 * lanes: its sixteen row pointers spilled. On a Zen 4 core (float at
 * AVX-512), `linear` (1, 768) -> 2304 took 0.978x the time on 1 thread and
 * 0.965x on 2, (2, 768) -> 2304 0.94x, (4, 1024) -> 1024 0.937x; with 8
 * lanes eight pointers fit: AVX2's floats 0.99x, AVX-512's doubles
 * 1.03-1.045x (benchmarks/NOTES.md). */
#define GEMM_FEW_ROWS_SPACED (VLANES > 8)
/* From this many rows of A, the few-rows order loads its weights' rows a
 * 16-byte block at a time (load_turned by blocks: half the shuffles of
 * whole vectors turned in registers), unless they are 4 KB apart
 * (GEMM_SET_ALIASING_BYTES: each row's line is then read by four loads
 * of a block, and lost between them). At AVX2 from one row (halves joined
 * by an insert from memory, where vperm2f128 needs a shuffle port; rows 4
 * KB apart loaded whole measured the same). At AVX-512 from 6 rows, where
 * the multiply-adds and the shuffles share a port: on a Zen 4 core, `linear`
 * (8, 768) -> 2304 0.84x the time, (8, 768) -> 768 0.845x, (8, 512) ->
 * 2048 0.87x, 7 rows 0.91x, 6 0.97x; 4 and 5 rows 0.92-1.01x, 1 and 2 rows
 * 0.99-1.02x, where one row's chain of multiply-adds sets the pace; rows 4
 * KB apart by blocks, (4, 1024) -> 1024 1.52x, (4, 4096) -> 4096 1.19x
 * (benchmarks/NOTES.md). */
#define GEMM_FEW_ROWS_BY_BLOCKS_FROM (SIMD_BYTES == 64 ? 6 : 1)
/* From this many rows of A, at AVX2's width (SIMD_BYTES 32) for float and
 * double, the few-rows order puts A's rows in the lanes (few_rows_lanes):
 * a step is one vector of A and one broadcast element of each of
 * GEMM_LANES_COLUMNS weight rows, nothing turned in registers. Its time
 * is the same for any M up to a vector's lanes, where few_rows_block's
 * grows with M: on a Zen 3 core, 1 thread, against few_rows_block, float
 * (8, 768) -> 2304 0.81-0.89x the time, (8, 768) -> 768 0.88x, but 7 rows
 * 0.99-1.02x, 6 rows 0.92-1.08x and 2 to 5 rows 1.25-1.66x; double
 * (turned 4 x 4, slower) 2 to 4 rows 0.66-0.81x at (K, N) = (768, 2304)
 * and (256, 768), 0.97-1.03x at (512, 1536) (benchmarks/NOTES.md). */
#define GEMM_FEW_ROWS_IN_LANES_FROM (sizeof(real) == 8 ? 2 : 8)
#define GEMM_LANES_COLUMNS 12
/* Packing contiguous weights costs about as much as multiplying them by
 * this many more rows of A: 4 at AVX-512 (float and double), 2 at AVX2
 * (float and double), 1 at the 16-byte portable level's float (its double
 * and the wide portable builds take the same SIMD_BYTES / 16 unmeasured),
 * measured on a Zen 4 core as the padding at which the transposed order
 * stops paying ((M, 256) x (768, 256)^T, 1 thread; an Ice Lake core had
 * put it near 10 rows at AVX-512 before edge tiles ran on fewer rows:
 * benchmarks/NOTES.md). The transposed order is taken only where it pads A
 * by at most this much more than the packed orders. */
#define GEMM_PACKING_ROWS (SIMD_BYTES / 16)
/* A tile of one vector of columns (gemm_tile_rows at C's right edge)
 * loads a broadcast of A for each multiply-add, where two vectors load one
 * for two: the transposed order counts its last tile, when it is one
 * vector (x's rows are its columns), as this many rows of padding more.
 * VLANES / 8: 2 at AVX-512's float, where against the streamed order, on a
 * Xeon family 6 model 207 (1 thread / 2, best / median), `linear` (12, 512)
 * -> 1536 in one-vector tiles took 1.24 / 1.05x the time and 1.19 / 1.22x,
 * (13, 512) -> 1536 0.78 / 0.91x and 0.79 / 0.97x, (14, 768) -> 2304 0.70 /
 * 0.71x and 0.69 / 0.87x, (16, 512) -> 512 0.79 / 0.95x and 0.93 / 0.90x,
 * module (1, 14, 768) 0.72 / 0.72x and 0.97 / 0.93x, (48, 768) -> 2304 1.01
 * / 1.04x and 0.90 / 1.03x; 1 at AVX2 and AVX-512's double, 0 at 16 bytes
 * (not measured) (benchmarks/NOTES.md). */
#define GEMM_ONE_VECTOR_TILE_ROWS (VLANES / 8)
/* The transposed order's rows at most, at AVX2 and AVX-512: its loop
 * broadcasts from the weight rows read in place (at AVX2 their offsets
 * partly reloaded from the stack), and it ran behind the packed order from
 * about 96 rows: on a Zen 3 core (AVX2), (M, 256) x (768, 256)^T in the
 * packed order took 0.944x the time at M = 96 and 0.914x at 128 on 1
 * thread, 0.855x and 0.877x on 2, (112, 256) x (256, 256)^T 0.946x and
 * 0.916x, at M = 64 0.95-1.02x. At AVX-512 on AMD, 96 rows: on a Zen 4
 * core, once partial slivers were turned as they are packed (pack_sliver),
 * against the streamed order (the same bits; median of 15 rounds),
 * `linear` (77, 512) -> 1536 took 0.96x the time on 1 and 2 threads,
 * (77, 768) -> 2304 0.96x and 0.975x, (96, 512) -> 1536 0.97x and 0.98x,
 * (80, 512) -> 512 0.97x and 0.98x, modules (1, 77, 512) 0.98x, (1, 80,
 * 768) 0.96x, (1, 96, 512) 0.99x on 2 threads; at 112 and 128 rows
 * 0.96-1.05x (modules (1, 128, 256) 1.05x, (1, 128, 512) 1.02x on 2).
 * (An earlier Zen 4 measure had put the packed order ahead at 96 rows,
 * before those turned partial slivers: benchmarks/NOTES.md.) Float only:
 * AVX-512's doubles (not measured so) keep 64, and so does Intel's AVX-512
 * (not measured past 64 rows: GEMM_TRANSPOSED_MAX_ROWS_INTEL).
 * At the 16-byte level (not measured so) only GEMM_TRANSPOSED_X_BYTES
 * bounds it. */
#define GEMM_TRANSPOSED_MAX_ROWS (SIMD_BYTES == 64 && sizeof(real) == 4 ? 96 : SIMD_BYTES >= 32 ? 64 : PTRDIFF_MAX)
#define GEMM_TRANSPOSED_MAX_ROWS_INTEL (SIMD_BYTES >= 32 ? 64 : PTRDIFF_MAX)
/* The transposed order's packed x block (padded rows, K block) at most,
 * so that it stays in L2 while the weights pass: 144 KB, 48 rows of float
 * at K = 768 (the order up to 80 rows with a 192 KB block measured the
 * same on a Zen 3 core: benchmarks/NOTES.md); for AVX-512's floats (Zen 4's
 * L2 is 1 MB), 288 KB: the 96 rows of GEMM_TRANSPOSED_MAX_ROWS at K = 768
 * (module (1, 64, 768), 192 KB, took 0.96x the time on 2 threads). */
#define GEMM_TRANSPOSED_X_BYTES ((SIMD_BYTES == 64 && sizeof(real) == 4 ? 288 : 144) * 1024)
/* On Intel's server cores at AVX-512 (2 MB of L2, and their packing of the
 * weights dearer), 64 rows of a whole K block: on a Xeon family 6 model 167,
 * against the packed orders (the same bits; 2 threads, best / median),
 * `linear` (64, 768) -> 2304 0.90 / 0.90x the time, (64, 1024) -> 3072 0.86
 * / 0.84x, (64, 4096) -> 4096 0.81 / 0.84x, (60, 768) -> 768 0.99 / 0.98x,
 * module (1, 64, 768) 0.91 / 0.90x, (1, 60, 1024) 0.91 / 0.95x
 * (benchmarks/NOTES.md). */
#define GEMM_TRANSPOSED_X_BYTES_INTEL (SIMD_BYTES == 64 ? 256 * 1024 : GEMM_TRANSPOSED_X_BYTES)
/* The streamed order reads A's whole slivers in place, at AVX2 and
 * AVX-512: each thread's packed copy of A cost more than the broadcasts
 * from its rows, once those take three row pointers and three offsets
 * (gemm_tile) instead of twelve offsets that spilled. On a Zen 4 core, 2
 * threads: `linear` (256, 256, 256) 0.94x the time, (256, 256, 768)
 * 0.97-0.98x, (512, 768, 2304) 0.98x, module (2, 128, 256) 0.97-0.98x;
 * x of 1-2 MB (from L3 either way) unchanged. At the 16-byte level 1.05-1.10x
 * the time: it packs (benchmarks/NOTES.md). */
#define GEMM_STREAMED_A_IN_PLACE (SIMD_BYTES >= 32)
/* Rows this many bytes apart (or a multiple: 1024 floats, 512 doubles)
 * fall in one set of an L1 data cache (64 sets of 64-byte lines: Zen 3 to
 * 5, Ice Lake), so the micro-kernel's broadcasts from MR rows read in place
 * evict each other's lines before each line's 16 steps are used: on a Zen 4
 * core, `linear` (50, 1024) -> 3072 took 1.25x the time of (50, 1040),
 * (200, 1024) -> 1024 1.15x that of (200, 1040). Such rows are packed: A's
 * in the streamed order, 0.74x the time of (50, 1024) -> 3072 on 1 and 2
 * threads, 0.66-0.79x (200, 1024) -> 1024, module (1, 50, 1024) 0.83-0.89x;
 * the weights instead of the transposed order, (32, 1024) -> 3072 0.93x
 * (1 thread), 0.885x (2), where the MR rows are more than the set's ways
 * (rows_evict_each_other: Zen 4's L1 has 8, AVX-512's MR is 12). Where
 * they are not, the transposed order keeps the weights in place: on a
 * Xeon whose L1 has 12 ways (family 6 model 207), against packing them,
 * (32, 1024) -> 3072 0.67-0.74x the time on 1 thread, 0.73-0.84x on 2,
 * (32, 4096) -> 4096 0.64-0.66x, at AVX2 (MR 6) (16, 1024) -> 3072
 * 0.62-0.66x; x read in place in the streamed order there measured no
 * faster than packed ((200, 1024) -> 1024 0.98-1.15x), so x stays
 * packed at any ways (benchmarks/NOTES.md). */
#define GEMM_SET_ALIASING_BYTES 4096
/* How far ahead the micro-kernel asks for its B sliver's rows: a (KC, NR)
 * sliver is 96 KB of float at NR = 32 (48 at 16) and streams from L2 once
 * per A sliver; on an Ice Lake core, 2 threads, asking took 0.92-0.99x the
 * time, 1 thread unchanged (benchmarks/NOTES.md). */
#define GEMM_PREFETCH_STEPS 8
/* The streamed order packs each B sliver (the weights' next NR rows) just
 * before its tiles, from L3 when the weights outsize L2: 24 % of `linear`
 * (50, 1024) -> 3072 on a Xeon core. Its first full tiles of a sliver
 * ask, as they run, for the rows of the task's next sliver, this many rows
 * a tile (a line of each every line's worth of steps, into L2), so that
 * its packing reads them from L2. On a Xeon family 6 model 207, the same
 * bits, best / median: `linear` (50, 1024) -> 3072 0.91 / 0.92x the time
 * on 1 thread and 0.91 / 0.87x on 2, (50, 1024) -> 1024 0.92 / 0.98x and
 * 0.93 / 0.92x, module (1, 50, 1024) 0.91 / 0.96x and 0.90 / 0.90x; (77,
 * 512) -> 1536 0.98 / 0.94x and 1.03 / 1.03x. 16 rows a tile (half the
 * tiles asking, twice as much each): 0.92-1.05x best, 0.96-1.02x median
 * on the same cases. Weights that
 * stay in L2 from call to call ((256, 256) -> 768) measured even
 * (benchmarks/NOTES.md). */
#define GEMM_NEXT_SLIVER_ROWS 8
/* Packing an operand given by columns (its rows adjacent: a gradient's
 * dY^T, a weight's transpose) copies each step's run of a sliver's rows
 * from cs elements past the last step's: kilobytes apart, a stride the
 * hardware prefetchers did not follow, so each step waited on its line from
 * L3. The packing asks for the run this many steps ahead. On a Xeon family
 * 6 model 207 (2 threads), the weight gradient of (512, 768) -> 2304
 * (`linear` of dY^T by x^T) spent 0.29 of its micro-kernel's samples
 * packing with none asked for, 0.22 at 4 and 8 steps, 0.16 at 16, 0.18 at
 * 32 (benchmarks/NOTES.md). */
#define GEMM_BY_COLUMNS_AHEAD 16
/* Packing an element takes about as long as this many of the micro-kernel's
 * flops (one Zen 4 core packed a (256, 256) A, 67.6K elements, in 10 us,
 * where the micro-kernel runs 100 GFLOP/s: 15): the packing pass's work in
 * the flops the pool weighs against waking a thread. Counted as one flop
 * an element, that pass ran on the caller alone, and at 2 threads took a
 * third of a `linear` (256, 256, 256) (60 us, the other thread waiting;
 * perf puts the time on its stores, into lines of packed A that the other
 * core read in the call before). Shared, 0.91x the call's time
 * (benchmarks/NOTES.md). */
#define GEMM_PACK_ELEMENT_FLOPS 16
/* A tile of fewer than MR rows runs the micro-kernel on a multiple of
 * this many (gemm_tile_rows): thirds of AVX-512's 12 and AVX2's 6, halves
 * of the 4 of 16-byte vectors. At MR 12, a (256, K) A took 22 slivers, 264
 * rows, for 256: the last one's 8 padding rows cost 3 % of the product. */
#define GEMM_MR_STEP (GEMM_MR % 3 == 0 ? GEMM_MR / 3 : GEMM_MR / 2)

/* Whether `rows` rows, `rs_bytes` apart, each read in place a line at a
 * time over many steps, evict each other's lines from L1: all in one set
 * (GEMM_SET_ALIASING_BYTES) and more than its ways (attnc_l1d_ways; 0,
 * unknown, counts as too few). */
static inline int rows_evict_each_other(idx_t rs_bytes, int rows)
{
    return rs_bytes % GEMM_SET_ALIASING_BYTES == 0 && rows > attnc_l1d_ways();
}

/* The first of `count` rows (or columns) in block b of n_blocks: the blocks
 * cut them in whole slivers of `width`, as evenly as whole slivers go, the
 * slivers left over spread evenly among the blocks (block b starts after
 * extra * b / n_blocks of them), so that each thread's share of consecutive
 * blocks gets the same work within a sliver: the 22 slivers of a (256, 256)
 * weight in 4 blocks were 6, 6, 5, 5 (12 for the caller's two blocks, 10
 * for the worker's) and are 5, 6, 5, 6. */
static inline idx_t gemm_block_start(idx_t count, idx_t width, idx_t n_blocks, idx_t b)
{
    idx_t slivers = attnc_ceil_div(count, width), per = slivers / n_blocks, extra = slivers % n_blocks;
    return attnc_min(count, (per * b + extra * b / n_blocks) * width);
}

/* Rows of C^T a transposed job's thread computes into its panel before
 * turning them into C: whole tiles (a multiple of every GEMM_MR: 12, 6,
 * 4) and whole blocks of vtranspose (of every VLANES: 16, 8, 4, 2), few
 * enough that the panel stays in L1 (12 KB at 64 float columns, 18 KB at
 * AVX-512's 96). */
#define GEMM_PANEL_ROWS 48

/* The micro-kernel's K loop two steps a pass at AVX2 and AVX-512: the same
 * operations in the same order (the same bits), half the loop's pointer
 * updates and branches. On a Zen 3 core (AVX2): `linear` (512, 768, 2304)
 * 0.91-0.93x the time on 1 thread and 0.96x on 2, (256, 256, 768) 0.91x
 * and 0.94x, modules 0.93-0.99x, SDPA 0.95-0.99x. On a Xeon (AVX-512),
 * SDPA 0.95-0.98x on 1 and 2 threads (medians; its two products' tiles;
 * (4, 16, 256, 128) 1.02x on 2, best 0.98x), `linear` and modules
 * 0.98-1.02x (benchmarks/NOTES.md). Not measured at 16 bytes, which keeps
 * the loop as it was. */
#if SIMD_BYTES >= 32
#  define GEMM_K_UNROLL _Pragma("GCC unroll 2")
#else
#  define GEMM_K_UNROLL
#endif
#endif

/* ------------------------------------------------------------------------ */
/* the micro-kernel                                                          */

/* c (rows, w) = init (rows, w) + a (rows, kc) . b (kc, w), w = vectors x
 * VLANES, rows <= MR and vectors 1 or 2 (constants: gemm_tile_rows picks
 * them; w is NR but at C's right edge), or c += a . b when
 * init is NULL (a constant NULL compiles the loads away); init's rows are
 * init_rs apart (0: one row for all). With a scale (not NULL, with init
 * only), c = *scale * (init + a . b), rounded as a multiply after the sum.
 * b is a packed sliver (b_rs 0: a constant): NR contiguous elements per
 * step (of which the first w are read), aligned to the vector size; or a
 * matrix's rows read in place, b_rs apart (their first w elements, at any
 * alignment). a's
 * element (i, p) is a[i * a_rs + p * a_step] (only broadcast): a packed
 * sliver (a_rs 1, a_step MR) or a matrix read in place. Per step, `vectors`
 * vector loads of B and vectors * rows FMAs. c's rows are c_rs apart. With stream_b (a
 * constant: the GEMM's tiles), b is a sliver KC steps deep, larger than L1,
 * whose rows GEMM_PREFETCH_STEPS ahead are asked for while these compute,
 * and C is in memory. With pairs
 * (a constant; BF16_PAIRS only), a step is two of the product's: every
 * element of a and b is a pair of bfloat16 (storage.h), multiplied by
 * vdot_pairs. With next_rows (not NULL: the streamed order's first tiles
 * of a sliver), GEMM_NEXT_SLIVER_ROWS rows of elements, next_rs bytes
 * apart, from the K block's first step: a line of each is asked for into
 * L2 every line's worth of steps (the next sliver's weights, for its
 * pack_sliver). */
static inline __attribute__((always_inline)) void FN(gemm_tile)(int rows, int vectors, idx_t kc, const real *a,
                                                                idx_t a_rs, idx_t a_step,
                                                                const real *b, idx_t b_rs, real *c, idx_t c_rs,
                                                                const real *init, idx_t init_rs, const real *scale,
                                                                int stream_b, int pairs, const char *next_rows,
                                                                idx_t next_rs)
{
    vreal acc[GEMM_MR][2], factor = scale ? vset1(*scale) : vzero(); /* read once: c may alias it */
    _Pragma("GCC unroll 12") for (int i = 0; i < rows; i++) {
        acc[i][0] = init ? vloadu(init + i * init_rs) : vzero();
        acc[i][1] = init && vectors == 2 ? vloadu(init + i * init_rs + VLANES) : vzero();
        /* start loading C's row (it may straddle cache lines) while the K
         * loop runs, when it is added to or is the GEMM's (in memory):
         * waiting for it at the end cost a sixth of the time. Attention's
         * score tiles (only stored, in L2) take 0.99x the time without. */
        if (!init || stream_b) {
            __builtin_prefetch(c + i * c_rs);
            __builtin_prefetch(c + i * c_rs + vectors * VLANES - 1);
        }
    }
    /* A's rows in groups of four from a base each: element (i, p) at
     * group[i / 4][(i % 4) * a_rs], so that rows read in place (a_rs not
     * 1) take three base pointers and three offsets, scaled addresses of
     * one register, not twelve offsets that spill */
    const real *group[(GEMM_MR + 3) / 4];
    for (int g = 0; g < (GEMM_MR + 3) / 4; g++) group[g] = 4 * g < rows ? a + 4 * g * a_rs : a;
    idx_t offset[4] = {0, a_rs, 2 * a_rs, 3 * a_rs};
    const size_t step_bytes = sizeof(elem) * (pairs ? 2 : 1); /* a step of next_rows */
    /* Steps in runs of a line's worth of next_rows, whose asks come
     * before each run: no test of next_rows or of the step in the loop
     * (one run of all kc steps without next_rows) */
    const idx_t run_steps = next_rows ? (idx_t)(64 / step_bytes) : kc;
    for (idx_t p0 = 0; p0 < kc; p0 += run_steps) {
        if (next_rows) /* a line of each of the next sliver's rows */
            for (int r = 0; r < GEMM_NEXT_SLIVER_ROWS; r++)
                __builtin_prefetch(next_rows + r * next_rs + p0 * step_bytes, 0, 2);
        const idx_t p_end = attnc_min(kc, p0 + run_steps);
        GEMM_K_UNROLL for (idx_t p = p0; p < p_end; p++, b += b_rs ? b_rs : GEMM_NR) {
            if (stream_b) { /* a step's B is one cache line, or two (NR = 32 floats) */
                __builtin_prefetch(b + GEMM_PREFETCH_STEPS * GEMM_NR);
                if (vectors == 2 && GEMM_NR * sizeof(real) > 64)
                    __builtin_prefetch(b + GEMM_PREFETCH_STEPS * GEMM_NR + VLANES);
            }
            vreal b0 = b_rs ? vloadu(b) : vload(b);
            vreal b1 = vectors == 2 ? (b_rs ? vloadu(b + VLANES) : vload(b + VLANES)) : vzero();
            _Pragma("GCC unroll 12") for (int i = 0; i < rows; i++) {
                vreal ai = vset1(group[i / 4][offset[i % 4]]);
                acc[i][0] = vmac(pairs, ai, b0, acc[i][0]);
                if (vectors == 2) acc[i][1] = vmac(pairs, ai, b1, acc[i][1]);
            }
            for (int g = 0; g < (GEMM_MR + 3) / 4; g++) group[g] += a_step;
        }
    }
    _Pragma("GCC unroll 12") for (int i = 0; i < rows; i++, c += c_rs) {
        for (int v = 0; v < vectors; v++) {
            if (!init)
                acc[i][v] = vadd(vloadu(c + v * VLANES), acc[i][v]);
            else if (scale)
                acc[i][v] = acc[i][v] * factor;
            vstoreu(c + v * VLANES, acc[i][v]);
        }
    }
}

/* The micro-kernel on the tile whose first row has m rows left below it
 * and whose first column has n columns left right of it (both from 1): MR
 * or more run a whole tile; fewer (C's bottom edge, a key or query tile's
 * last rows) run on the fewest whole GEMM_MR_STEP rows that hold them (rows
 * past m computed from the zero padding and stored like the rest; rows past
 * those neither computed nor written), not on MR rows of which the rest
 * are padding. Likewise n up to VLANES (C's right edge) runs on one vector
 * of columns, not NR: the columns past it neither computed nor written. */
static inline __attribute__((always_inline)) void FN(gemm_tile_rows)(idx_t m, idx_t n, idx_t kc, const real *a,
                                                                     idx_t a_rs, idx_t a_step, const real *b,
                                                                     idx_t b_rs, real *c,
                                                                     idx_t c_rs, const real *init, idx_t init_rs,
                                                                     const real *scale, int stream_b, int pairs)
{
    idx_t steps = attnc_ceil_div(m, GEMM_MR_STEP);
    int rows = steps == 1 ? GEMM_MR_STEP : steps == 2 && 2 * GEMM_MR_STEP < GEMM_MR ? 2 * GEMM_MR_STEP : GEMM_MR;
#define GEMM_TILE_OF(ROWS, VECTORS) \
    FN(gemm_tile)(ROWS, VECTORS, kc, a, a_rs, a_step, b, b_rs, c, c_rs, init, init_rs, scale, stream_b, pairs, NULL, 0)
    if (n <= VLANES) {
        if (rows == GEMM_MR_STEP) GEMM_TILE_OF(GEMM_MR_STEP, 1);
        else if (rows == 2 * GEMM_MR_STEP) GEMM_TILE_OF(2 * GEMM_MR_STEP, 1);
        else GEMM_TILE_OF(GEMM_MR, 1);
    } else {
        if (rows == GEMM_MR_STEP) GEMM_TILE_OF(GEMM_MR_STEP, 2);
        else if (rows == 2 * GEMM_MR_STEP) GEMM_TILE_OF(2 * GEMM_MR_STEP, 2);
        else GEMM_TILE_OF(GEMM_MR, 2);
    }
#undef GEMM_TILE_OF
}

/* ------------------------------------------------------------------------ */
/* packing                                                                   */

/* The steps of a product over E elements: E, or with pairs ceil(E / 2);
 * and those all of whose elements exist (the rest is an odd E's last). */
static inline idx_t FN(product_steps)(idx_t E, int pairs) { return BF16_PAIRS && pairs ? E / 2 + E % 2 : E; }
static inline idx_t FN(whole_steps)(idx_t E, int pairs) { return BF16_PAIRS && pairs ? E / 2 : E; }

/* An operand of the product: rows stacked from up to ATTNC_GEMM_MAX_PARTS
 * strided blocks; element (r, p) of part q is data[q][r * rs + p * cs]
 * for r counted from the part's first row (ends[q - 1]). */
typedef struct {
    const elem *data[ATTNC_GEMM_MAX_PARTS];
    idx_t ends[ATTNC_GEMM_MAX_PARTS]; /* one past each part's last row */
    int n_parts;
    idx_t rs, cs;
} FN(gemm_operand);

/* The first element of row r. */
static inline const elem *FN(operand_row)(const FN(gemm_operand) *x, idx_t r)
{
    int q = 0;
    while (q < x->n_parts - 1 && r >= x->ends[q]) q++;
    return x->data[q] + (r - (q ? x->ends[q - 1] : 0)) * x->rs;
}

/* Everything the tasks share; p0, kc name the K block being added.
 * Transposed, the job computes C^T = B . A^T: its A is the caller's B (the
 * weights, read in place), its B the caller's A, and it writes C^T's tile
 * (r, s) to C (s, r); the bias then runs along the job's rows. */
typedef struct {
    idx_t M, N;
    FN(gemm_operand) a, b;   /* A (M, K), B (N, K) */
    const real *bias;        /* (N), or (M) when transposed, or NULL */
    real *c;                 /* C (M, N), rows c_rs apart; (N, M) when transposed */
    idx_t c_rs;
    idx_t n_row_blocks, n_col_blocks; /* the tasks: blocks of C (gemm_block_start) */
    real *packed_a, *packed_b; /* (M / MR, steps, MR), (N / NR, steps, NR), rounded up; */
    int streamed;              /* or a sliver (steps, NR) per task, packed in pass 2 */
    int transposed;            /* A read in place but for its irregular slivers: */
    int n_irregular;           /* those cut by the bottom edge or a part's end, */
    idx_t irregular[ATTNC_GEMM_MAX_PARTS]; /* by first row, packed in packed_a */
    /* Streamed or transposed: the small operand (A, or B) all of which
     * every task multiplies, in own_copies copies own_stride apart, one a
     * thread (own_copy), or 0: packed once for all by pass 1 */
    int own_copies;
    idx_t own_stride;
    /* Streamed, A's rows from here on packed; the whole slivers before it
     * read in place (a_packed_from, a multiple of MR, or 0: all packed) */
    idx_t a_packed_from;
    int own_packed[GEMM_OWN_COPY_THREADS]; /* thread t's copy holds the current K block */
    /* Blocked with one column block: each task packs its own row block of
     * A, into a block a thread (own_stride apart), instead of pass 1 (see
     * plan_job) */
    int a_by_task;
    /* Transposed: a panel a thread for GEMM_PANEL_ROWS rows of C^T at a
     * time, (GEMM_PANEL_ROWS, N rounded up to NR), panel_stride elements
     * apart (transposed_block) */
    real *panels;
    idx_t panel_stride;
    idx_t p0, kc, steps; /* steps: product_steps(kc, BF16_PAIRS) */
    idx_t block_slivers; /* streamed: B slivers a task packs (or reads) at a time, A multiplied by each */
    /* B packed before the call (pack_weights), or NULL: the blocked and
     * streamed orders then read its slivers there and pack none */
    const real *packed_weights;
    idx_t packed_block; /* elements of packed_weights a K block */
} FN(gemm_job);

/* The init row of the first K block when there is no bias. */
static const real FN(gemm_zeros)[64];

#define GEMM_MAX_WIDTH (GEMM_NR > GEMM_MR ? GEMM_NR : GEMM_MR)

/* dst[l * width + r] <- scale * rows[r][p + l] for r < lanes, l < VLANES:
 * VLANES steps of a group of up to VLANES rows of a sliver `width` rows
 * wide, turned in registers. A NULL row gives zeros (padding); a group of
 * fewer than VLANES rows (the last of an MR-wide sliver) is stored short,
 * never past its slots. With pairs (BF16_PAIRS only), step p + l is the
 * pair of elements 2 (p + l) and 2 (p + l) + 1, unscaled. Every packing of
 * rows into slivers goes through it: the GEMM's operands (scale 1,
 * pack_sliver) and the attention's queries, keys, values and dO
 * (pack_row_slivers). */
static inline __attribute__((always_inline)) void FN(turn_rows)(real *dst, const elem *const *rows, int lanes,
                                                                idx_t p, idx_t width, real scale, int pairs)
{
    vreal block[VLANES];
    for (int l = 0; l < VLANES; l++) {
        block[l] = vzero();
        if (l >= lanes || !rows[l]) continue;
#if BF16_PAIRS
        if (pairs) {
            block[l] = FN(vload_pairs)(rows[l] + 2 * p);
            continue;
        }
#endif
        block[l] = vset1(scale) * vload_elems(rows[l] + p);
    }
    vtranspose(block);
    for (int l = 0; l < VLANES; l++) {
        if (lanes == VLANES)
            vstoreu(dst + l * width, block[l]);
        else
            vstore_first(dst + l * width, block[l], lanes);
    }
}

/* Whether rows[0 .. n) are consecutive elements (an operand whose row
 * stride is 1, all n in one part). */
static inline int FN(rows_are_adjacent)(const elem *const *rows, idx_t n)
{
    for (idx_t r = 1; r < n; r++)
        if (rows[r] != rows[0] + r) return 0;
    return 1;
}

/* dst (steps, width) <- x rows [r0, r0 + rows), elements [p0, p0 + kc)
 * (with BF16_PAIRS a step is a pair of them, an odd kc's last (x, 0));
 * rows past `rows` are zeros, so an edge tile computes like a full one. */
static void FN(pack_sliver)(real *dst, const FN(gemm_operand) *x, idx_t r0, idx_t rows, idx_t width, idx_t p0,
                            idx_t kc)
{
    const elem *row[GEMM_MAX_WIDTH];
    for (idx_t r = 0; r < width; r++) row[r] = r < rows ? FN(operand_row)(x, r0 + r) + p0 * x->cs : NULL;
    idx_t p = 0, cs = x->cs, steps = FN(product_steps)(kc, BF16_PAIRS), whole = FN(whole_steps)(kc, BF16_PAIRS);
    if (cs == 1 && whole >= VLANES) {
        /* slivers of rows in place (the weights of a linear layer, the
         * rows of x), the padding rows past `rows` (NULL) turned into
         * zeros with them: VLANES steps of up to VLANES rows at a time,
         * turned in registers (a fifth of the instructions of the loop
         * below), a group of VLANES rows after another. The steps up to
         * the first row's next vector boundary go first, as a whole turned
         * block (the next block rewrites its last steps with the same
         * values), so that the loads after them are aligned where the rows
         * are a multiple of 64 bytes apart; the last block ends at `whole`,
         * over steps already stored. Aligned, a group at a time: the 1024-
         * float rows of NumPy's weights (16 bytes past a line, 4 KB apart,
         * all in one L1 set) packed 2.6x faster on a Zen 4 core, 768-float
         * rows 1.2x. Slivers cut short (x's last rows in the transposed
         * order, the weights' last in the streamed) had gone one element
         * at a time through the loop below after zeroing the whole
         * sliver: turned, `linear` (13, 512) -> 512 took 0.94x the time on
         * a Zen 4 core (1 thread), (200, 512) -> 77 0.97x (benchmarks/NOTES.md). */
        const size_t step_bytes = sizeof(elem) * (BF16_PAIRS ? 2 : 1), vector_bytes = VLANES * step_bytes;
        idx_t lead = (idx_t)((vector_bytes - (uintptr_t)row[0] % vector_bytes) % vector_bytes / step_bytes);
        for (idx_t g = 0; g < width; g += VLANES) {
            int lanes = (int)attnc_min(VLANES, width - g);
            for (idx_t q = 0; q < whole; q = q == 0 && lead ? lead : q + VLANES) {
                idx_t at = attnc_min(q, whole - VLANES);
                FN(turn_rows)(dst + at * width + g, row + g, lanes, at, width, 1, BF16_PAIRS);
            }
        }
        p = whole;
    }
    if (rows < width) /* the padding rows of the steps left */
        for (idx_t k = p * width; k < steps * width; k++) dst[k] = 0;
    if (!BF16_PAIRS && cs != 1 && FN(rows_are_adjacent)(row, rows)) {
        /* adjacent rows (an operand given by columns: a gradient's dY^T
         * as A, a (K, N) matrix as B): each step's elements are one run,
         * copied as vectors, where the loop below fetches each through
         * its row's pointer. `linear` by a (768, 768) weight's transpose,
         * x (512, 768): 0.94x the time (1 thread); x (128, 256), 768
         * outputs: 0.86x (benchmarks/NOTES.md) */
        for (; p < steps; p++) {
            if (p + GEMM_BY_COLUMNS_AHEAD < steps)
                PREFETCH_ELEMENTS(row[0] + (p + GEMM_BY_COLUMNS_AHEAD) * cs, rows, 3);
            FN(load_row)(dst + p * width, row[0] + p * cs, rows);
        }
        return;
    }
    /* the rest one step p at a time: contiguous writes, and `width` rows
     * read side by side, each sequentially when cs == 1 */
    for (; p < steps; p++)
        for (idx_t r = 0; r < rows; r++)
#if BF16_PAIRS
            dst[p * width + r] = FN(pair_at)(row[r], p, cs, kc);
#else
            dst[p * width + r] = to_real(row[r][p * cs]);
#endif
}

/* Pass 1, task t: PACK_SLIVERS slivers of A, or (from task n_pack_a on)
 * of B, of those the tasks share (pass1_packs). Small tasks, so that the
 * threads end the pass together: with a task per block of C, one thread
 * was left packing the last 512 rows of B alone (benchmarks/NOTES.md).
 * Sliver s starts at s * width * steps, which is row * steps for its first
 * row. */
#define PACK_SLIVERS 4
static idx_t FN(pack_tasks)(idx_t rows, idx_t width) { return attnc_ceil_div(rows, PACK_SLIVERS * width); }

/* pass 1's tasks packing A (*n_a) and B (*n_b): the blocked order packs
 * both; the streamed order A (its tasks pack their B slivers), the
 * transposed B (A is read in place), unless own copies replace them */
static void FN(pass1_packs)(const FN(gemm_job) *job, idx_t *n_a, idx_t *n_b)
{
    int a = !job->transposed && !(job->streamed && job->own_copies) && !job->a_by_task;
    int b = !job->streamed && !job->packed_weights && !(job->transposed && job->own_copies);
    *n_a = a ? FN(pack_tasks)(job->M - job->a_packed_from, GEMM_MR) : 0;
    *n_b = b ? FN(pack_tasks)(job->N, GEMM_NR) : 0;
}

/* Rows [first, end) of A (or of B) packed into their slivers from
 * `packed` on (row r's sliver at (r - first) * steps). */
static void FN(pack_rows)(const FN(gemm_job) *job, int is_b, real *packed, idx_t first, idx_t end)
{
    const FN(gemm_operand) *x = is_b ? &job->b : &job->a;
    idx_t width = is_b ? GEMM_NR : GEMM_MR;
    for (idx_t r = first; r < end; r += width)
        FN(pack_sliver)(packed + (r - first) * job->steps, x, r, attnc_min(width, end - r), width, job->p0, job->kc);
}

static void FN(pack_task)(void *ctx, idx_t t)
{
    FN(gemm_job) *job = ctx;
    idx_t n_pack_a, n_pack_b;
    FN(pass1_packs)(job, &n_pack_a, &n_pack_b);
    int is_a = t < n_pack_a;
    idx_t block = PACK_SLIVERS * (is_a ? GEMM_MR : GEMM_NR);
    idx_t first = is_a ? job->a_packed_from + t * block : (t - n_pack_a) * block;
    FN(pack_rows)(job, !is_a, (is_a ? job->packed_a : job->packed_b) + first * job->steps, first,
                  attnc_min(is_a ? job->M : job->N, first + block));
}

/* ------------------------------------------------------------------------ */
/* blocks of C                                                               */

/* C (s, i0 + r) <- panel (r, s) for r < rows, s < N, or += it after the
 * first K block: rows [i0, i0 + rows) of a transposed job's C^T written to
 * C, in blocks of VLANES x VLANES turned in registers; each becomes up to
 * VLANES elements of VLANES rows of C (never past those columns: the next
 * ones may be another task's). */
static void FN(store_panel_transposed)(const FN(gemm_job) *job, const real *panel, idx_t i0, idx_t rows)
{
    int first = job->p0 == 0;
    for (idx_t r0 = 0; r0 < rows; r0 += VLANES) {
        int n = (int)attnc_min(VLANES, rows - r0);
        for (idx_t s0 = 0; s0 < job->N; s0 += VLANES) {
            vreal block[VLANES];
            _Pragma("GCC unroll 16") for (int l = 0; l < VLANES; l++)
                block[l] = l < n ? vloadu(panel + (r0 + l) * job->panel_stride + s0) : vzero();
            vtranspose(block);
            idx_t columns = attnc_min(VLANES, job->N - s0);
            real *c = job->c + s0 * job->c_rs + i0 + r0;
            /* (unrolled, so that block stays in registers) */
            _Pragma("GCC unroll 16") for (int l = 0; l < VLANES; l++, c += job->c_rs) {
                if (l >= columns) break;
                if (n == VLANES) {
                    vstoreu(c, first ? block[l] : vloadu(c) + block[l]);
                } else if (first) {
                    vstore_first(c, block[l], n);
                } else {
                    real sums[VLANES];
                    vstoreu(sums, block[l]);
                    for (int r = 0; r < n; r++) c[r] += sums[r];
                }
            }
        }
    }
}

/* The C tile at (i, j) += its A sliver . B sliver b, or, in the first K
 * block, = bias + that; A's sliver packed at a_sliver but for the whole
 * slivers a streamed job reads in place. A tile cut by the bottom or right
 * edge of C is computed in a buffer first, with the same operations in the
 * same order. */
static void FN(run_tile)(const FN(gemm_job) *job, idx_t i, idx_t j, const real *a_sliver, const real *b,
                         const char *next_rows)
{
    idx_t m = attnc_min(GEMM_MR, job->M - i), n = attnc_min(GEMM_NR, job->N - j);
    /* (GEMM_STREAMED_A_IN_PLACE again, though a_packed_from is 0 without
     * it: the constant keeps a_rs 1 known to the 16-byte level's full
     * tiles, whose blocked `linear` (1024, 768, 768) took 1.011x without) */
    int in_place = GEMM_STREAMED_A_IN_PLACE && i < job->a_packed_from;
    /* (in place only when elem is real: see gemm) */
    const real *a = in_place ? (const real *)FN(operand_row)(&job->a, i) + job->p0 * job->a.cs
                             : a_sliver;
    idx_t a_rs = in_place ? job->a.rs : 1, a_step = in_place ? job->a.cs : GEMM_MR;
    const real *bias = job->p0 == 0 ? job->bias : NULL; /* later K blocks add to C */
    int first = job->p0 == 0;
    if (m == GEMM_MR && n == GEMM_NR) {
        real *c = job->c + i * job->c_rs + j;
        idx_t next_rs = job->b.rs * (idx_t)sizeof(elem);
        /* A's step a constant in each copy (1 in place, where A's column
         * stride is 1: a_packed_from; MR packed), so that the unrolled K
         * loop reaches its steps by displacements */
#define GEMM_FULL_TILE(A_RS, A_STEP, INIT)                                                                         \
    FN(gemm_tile)(GEMM_MR, 2, job->steps, a, A_RS, A_STEP, b, 0, c, job->c_rs, INIT, 0, NULL, 1, BF16_PAIRS, next_rows, \
                  next_rs)
        const real *init = bias ? bias + j : FN(gemm_zeros);
        if (in_place && first) GEMM_FULL_TILE(a_rs, 1, init);
        else if (in_place) GEMM_FULL_TILE(a_rs, 1, NULL);
        else if (first) GEMM_FULL_TILE(1, GEMM_MR, init);
        else GEMM_FULL_TILE(1, GEMM_MR, NULL);
#undef GEMM_FULL_TILE
        return;
    }
    /* the tile's start: zeros, or the bias along its columns (one row for
     * all) */
    real init[GEMM_NR], tile[GEMM_MR * GEMM_NR];
    if (bias)
        for (idx_t s = 0; s < GEMM_NR; s++) init[s] = s < n ? bias[j + s] : 0;
    FN(gemm_tile_rows)(m, n, job->steps, a, a_rs, a_step, b, 0, tile, GEMM_NR, bias ? init : FN(gemm_zeros), 0, NULL, 1,
                       BF16_PAIRS);
    for (idx_t r = 0; r < m; r++)
        for (idx_t s = 0; s < n; s++) {
            real *c = job->c + (i + r) * job->c_rs + j + s;
            *c = first ? tile[r * GEMM_NR + s] : *c + tile[r * GEMM_NR + s];
        }
}

/* A transposed job's row block [i0, i1) (of B's rows, the weights): its
 * irregular slivers packed (each is one block's), then GEMM_PANEL_ROWS of
 * its rows at a time: each tile row of them (read in place, once) times all
 * of B (the caller's A, packed at packed_b) into this thread's panel of
 * C^T, started from the bias down its rows (a row per row) in the first K
 * block, then the panel turned into C.
 * Each (MR, NR) tile had been turned and stored on its own, its MR rows
 * padded to a vector's lanes, by masked stores: on a Zen 4 core the panels
 * took 0.974-0.978x the time of `linear` (32, 256, 256), (32, 768, 256)
 * and (64, 768, 256) on 1 thread, 0.975-1.00x on 2, module (1, 32, 256)
 * 0.97-0.98x; 0.90-0.98x at the 16-byte level, 0.95-0.97x at AVX2. One
 * panel per task for all its rows (24 KB at 32 columns) had taken 1.05x
 * on 2 threads (benchmarks/NOTES.md). */
_Static_assert(GEMM_PANEL_ROWS % GEMM_MR == 0 && GEMM_PANEL_ROWS % VLANES == 0,
               "a panel holds whole tiles and whole blocks of vtranspose");

static void FN(transposed_block)(const FN(gemm_job) *job, idx_t i0, idx_t i1, const real *packed_b)
{
    real *panel = job->panels + attnc_thread_index() * GEMM_PANEL_ROWS * job->panel_stride;
    for (int k = 0; k < job->n_irregular; k++) {
        idx_t start = job->irregular[k];
        if (start >= i0 && start < i1)
            FN(pack_sliver)(job->packed_a + k * GEMM_MR * job->steps, &job->a, start,
                            attnc_min(GEMM_MR, job->M - start), GEMM_MR, job->p0, job->kc);
    }
    const real *bias = job->p0 == 0 ? job->bias : NULL; /* later K blocks add to C */
    for (idx_t i = i0; i < i1 && !attnc_interrupted(); i += GEMM_MR) { /* a task may be long: all of N */
        idx_t m = attnc_min(GEMM_MR, job->M - i), chunk = (i - i0) / GEMM_PANEL_ROWS * GEMM_PANEL_ROWS;
        int slot = 0;
        while (slot < job->n_irregular && job->irregular[slot] != i) slot++;
        int in_place = slot == job->n_irregular;
        const real *a = in_place ? (const real *)FN(operand_row)(&job->a, i) + job->p0 * job->a.cs
                                 : job->packed_a + slot * GEMM_MR * job->steps;
        idx_t a_rs = in_place ? job->a.rs : 1, a_step = in_place ? job->a.cs : GEMM_MR;
        real init[GEMM_MR * GEMM_NR];
        for (idx_t r = 0; bias && r < GEMM_MR; r++)
            for (idx_t s = 0; s < GEMM_NR; s++) init[r * GEMM_NR + s] = r < m ? bias[i + r] : 0;
        for (idx_t j = 0; j < job->N; j += GEMM_NR)
            FN(gemm_tile_rows)(m, job->N - j, job->steps, a, a_rs, a_step, packed_b + j * job->steps, 0,
                               panel + (i - i0 - chunk) * job->panel_stride + j, job->panel_stride,
                               bias ? init : FN(gemm_zeros), bias ? GEMM_NR : 0, NULL, 1, BF16_PAIRS);
        if (i + GEMM_MR >= i1 || i + GEMM_MR - i0 - chunk == GEMM_PANEL_ROWS)
            FN(store_panel_transposed)(job, panel, i0 + chunk, attnc_min(GEMM_PANEL_ROWS, i1 - i0 - chunk));
    }
}

/* This thread's copy of the small operand (A streamed, B transposed),
 * packed by its first task of the K block. */
static const real *FN(own_copy)(FN(gemm_job) *job)
{
    int me = attnc_thread_index();
    int is_b = job->transposed;
    real *copy = (is_b ? job->packed_b : job->packed_a) + me * job->own_stride;
    if (!job->own_packed[me]) {
        idx_t first = is_b ? 0 : job->a_packed_from;
        FN(pack_rows)(job, is_b, copy + first * job->steps, first, is_b ? job->N : job->M);
        job->own_packed[me] = 1;
    }
    return copy;
}

/* The weight rows the streamed order's tile `tile` of a block (its tiles
 * counted in the order they run) asks for (gemm_tile's next_rows):
 * GEMM_NEXT_SLIVER_ROWS rows a tile of the `rows` from row `next` on (the
 * next block's), from the K block's first element, while there are rows
 * left for the block's first tiles to ask for (the next task's first block
 * after a task's last: the same thread's, but for its share's last); NULL
 * where the rows are not contiguous runs of elements one part holds
 * (pack_sliver then reads them as before). */
static const char *FN(next_sliver_rows)(const FN(gemm_job) *job, idx_t tile, idx_t next, idx_t rows)
{
    idx_t first = next + tile * GEMM_NEXT_SLIVER_ROWS, last = first + GEMM_NEXT_SLIVER_ROWS - 1;
    if (tile >= rows / GEMM_NEXT_SLIVER_ROWS || last >= job->N || job->b.cs != 1) return NULL;
    int q = 0;
    while (q < job->b.n_parts - 1 && first >= job->b.ends[q]) q++;
    if (last >= job->b.ends[q]) return NULL; /* the rows span two parts */
    return (const char *)(FN(operand_row)(&job->b, first) + job->p0);
}

/* Pass 2, task t: add the current K block to one block of C. Consecutive
 * tasks share a column block, so its B slivers stay in cache. A streamed
 * job has one row block, so t is its column block: the task packs each B
 * sliver of the block in turn, or each block of block_slivers of them,
 * into slot t of packed_b (it stays in L2) and multiplies all of A by it,
 * a sliver of A by each of the block's in turn. A transposed job has one
 * column block: the task is transposed_block. */
static void FN(multiply_task)(void *ctx, idx_t t)
{
    FN(gemm_job) *job = ctx;
    idx_t row_block = t % job->n_row_blocks, col_block = t / job->n_row_blocks;
    idx_t i0 = gemm_block_start(job->M, GEMM_MR, job->n_row_blocks, row_block);
    idx_t i1 = gemm_block_start(job->M, GEMM_MR, job->n_row_blocks, row_block + 1);
    idx_t j0 = gemm_block_start(job->N, GEMM_NR, job->n_col_blocks, col_block);
    idx_t j1 = gemm_block_start(job->N, GEMM_NR, job->n_col_blocks, col_block + 1);
    const real *packed_a = job->packed_a, *packed_b = job->packed_b;
    idx_t a_first = 0; /* the row packed_a's first sliver holds */
    if (job->a_by_task) {
        real *own = job->packed_a + attnc_thread_index() * job->own_stride;
        FN(pack_rows)(job, 0, own, i0, i1);
        packed_a = own, a_first = i0;
    }
    if (job->own_copies) {
        const real *own = FN(own_copy)(job);
        if (job->transposed)
            packed_b = own;
        else
            packed_a = own;
    }
    if (job->transposed) {
        FN(transposed_block)(job, i0, i1, packed_b);
        return;
    }
    int pack = job->streamed && !job->packed_weights; /* a block of slivers at a time, into slot t */
    idx_t width = (job->streamed ? job->block_slivers : 1) * GEMM_NR;
    real *slot = pack ? job->packed_b + t * width * job->steps : NULL;
    if (job->packed_weights) packed_b = job->packed_weights + job->p0 / ATTNC_GEMM_KC * job->packed_block;
    for (idx_t jb = j0; jb < j1 && !attnc_interrupted(); jb += width) { /* a task may be long: a few rows, all of N */
        idx_t je = attnc_min(j1, jb + width);
        for (idx_t j = jb; pack && j < je; j += GEMM_NR)
            FN(pack_sliver)(slot + (j - jb) * job->steps, &job->b, j, attnc_min(GEMM_NR, job->N - j), GEMM_NR,
                            job->p0, job->kc);
        idx_t tile = 0;
        /* (a streamed task's slivers multiply all of A: Ctrl-C is asked for a sliver of A at a time; a block
         * of a far A's slivers in an (8192, 4096) x (8192, 4096)^T `linear` under ASan had answered 1.2 s
         * after it, one sliver in a (65536, 1024) x (256, 1024)^T one 0.1 s) */
        for (idx_t i = i0; i < i1 && (!job->streamed || !attnc_interrupted()); i += GEMM_MR)
            for (idx_t j = jb; j < je; j += GEMM_NR, tile++) {
                const real *b = pack ? slot + (j - jb) * job->steps : packed_b + j * job->steps;
                FN(run_tile)(job, i, j, packed_a + (i - a_first) * job->steps, b,
                             pack ? FN(next_sliver_rows)(job, tile, je, width) : NULL);
            }
    }
}

/* ------------------------------------------------------------------------ */
/* the entry point                                                           */

/* Element j of the stacked bias (0 where a part has none). */
static real FN(bias_at)(const attnc_gemm_args *g, idx_t j)
{
    int q = 0;
    while (q < g->n_parts - 1 && j >= g->parts[q].rows) j -= g->parts[q++].rows;
    return g->parts[q].bias ? to_real(((const elem *)g->parts[q].bias)[j]) : 0;
}

/* C = bias + A . B^T by plain loops, in the packed path's order of
 * operations: each K block summed from its init (the bias, then zeros) by
 * sfma, then added to C. For tiny sizes, and for K == 0 (C = bias). */
static void FN(gemm_direct)(const attnc_gemm_args *g, idx_t N, const FN(gemm_operand) *a,
                            const FN(gemm_operand) *b)
{
    elem *c = g->c;
    for (idx_t j = 0; j < N; j++) {
        const elem *b_row = FN(operand_row)(b, j);
        real bias = FN(bias_at)(g, j);
        for (idx_t i = 0; i < g->M; i++) {
            const elem *a_row = FN(operand_row)(a, i);
            real total = bias;
            for (idx_t p0 = 0; p0 < g->K; p0 += ATTNC_GEMM_KC) {
                real sum = p0 == 0 ? total : 0;
                for (idx_t p = p0; p < attnc_min(g->K, p0 + ATTNC_GEMM_KC); p++)
                    sum = sfma(to_real(a_row[p * a->cs]), to_real(b_row[p * b->cs]), sum);
                total = p0 == 0 ? sum : total + sum;
            }
            c[i * g->c_rs + j] = to_elem(total);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* few rows of A                                                             */

/* The job of gemm_few_rows: C (M, N) for M <= GEMM_FEW_ROWS, by blocks of
 * `columns` outputs (rows of B: VLANES, or GEMM_LANES_COLUMNS in_lanes),
 * blocks_per_task blocks a task. */
typedef struct {
    const attnc_gemm_args *g;
    FN(gemm_operand) b;
    const real *a; /* A (M, K) widened, step-major: A (m, p) at p * a_step + m */
    idx_t N, blocks_per_task, a_step;
    int columns;
    int by_blocks; /* B's rows loaded a 16-byte block at a time (GEMM_FEW_ROWS_BY_BLOCKS_FROM) */
    int in_lanes;  /* few_rows_lanes (a_step VLANES, A's lanes past M zero) */
    int prefetch;  /* the next block's rows asked for (GEMM_FEW_ROWS_PREFETCH_FROM_BYTES) */
} FN(few_rows_job);

/* Whether the level has few_rows_lanes: AVX2's width, elements that are reals */
#define FEW_ROWS_LANES (SIMD_BYTES == 32 && ELEM_IS_REAL)

/* The first `count` of VLANES steps of few_rows_block from p: each chain's
 * VLANES rows of B (rows[c * VLANES + l]) have their elements p + s turned
 * in registers (all VLANES read), acc[c * M + m] += A (m, p + s) times
 * them, s < count in order. */
static inline __attribute__((always_inline)) void FN(few_rows_turned)(vreal *acc, const elem *const *rows, idx_t rs,
                                                                      const real *a, idx_t p, int count, int M,
                                                                      int chains, int by_blocks)
{
    vreal steps[FEW_ROWS_CHAINS][VLANES];
    for (int c = 0; c < chains; c++) FN(load_turned)(steps[c], rows + c * VLANES, rs, p, by_blocks);
    _Pragma("GCC unroll 16") for (int s = 0; s < VLANES; s++)
        if (s < count)
            _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) {
                vreal a_ms = vset1(a[(p + s) * M + m]);
                for (int c = 0; c < chains; c++) acc[c * M + m] = vfma(a_ms, steps[c][s], acc[c * M + m]);
            }
}

/* few_rows_turned for the steps up to the first row's vector boundary,
 * once a K block: M, count and by_blocks at run time, the accumulators in
 * memory. One copy a dtype: inlined in each few_rows_block copy, it (with
 * the by-blocks copies below GEMM_FEW_ROWS_BY_BLOCKS_FROM rows, never
 * run) took 14 s of the AVX-512 kernels' 72 s build. */
static __attribute__((noinline)) void FN(few_rows_lead)(vreal *acc, const elem *const *rows, idx_t rs, const real *a,
                                                       idx_t p, int count, int M, int chains, int by_blocks)
{
    if (by_blocks)
        FN(few_rows_turned)(acc, rows, rs, a, p, count, M, chains, 1);
    else
        FN(few_rows_turned)(acc, rows, rs, a, p, count, M, chains, 0);
}

/* C[:, j0, j0 + n) (n <= chains x VLANES outputs, one a lane) for the M
 * rows of A (M and chains constants at each call, so the accumulators stay
 * in registers): B's rows (`rows`, one a lane, addressed by row_of with
 * rs) are read in place and turned in registers VLANES steps at a time,
 * and each step is multiplied by every row's element. Each of the `chains`
 * blocks of VLANES outputs is a chain of multiply-adds per row of A; one
 * row of A alone waits on its chain's latency, so at FEW_ROWS_CHAINS two
 * blocks go side by side. The steps up to the
 * first row's next vector boundary go first (a whole turned block, of
 * which only they are used), so that the vector loads after them (of every
 * row, when rows are a multiple of 64 bytes apart) are aligned: a (1,
 * 4096) x (4096, 4096)^T `linear` whose rows start 16 bytes past a line
 * (NumPy's alignment) took 1.2-1.3x the time with every load split over two
 * lines. Loaded by blocks, the boundary is a 16-byte block's (no block of
 * a 16-byte aligned row straddles a line), so NumPy's rows need no lead:
 * it had taken 6.5 % of `linear` (8, 768) -> 2304 on a Xeon core (a call,
 * its accumulators in memory), and the product 0.94-0.98x the time on 1
 * thread without it, (1, 768) -> 2304 at AVX2 0.94x (benchmarks/NOTES.md).
 * A lane past n repeats the last output and
 * is not stored. Each element gets the packed path's operations in its
 * order: from the bias, the multiply-adds of a K block one step after
 * another, then the K blocks' sums added. With next_rows (not NULL: the
 * next block's rows, one run of memory), each turned step asks for its
 * share of those rows' lines, in order, into L2
 * (GEMM_FEW_ROWS_PREFETCH_FROM_BYTES). */
static inline __attribute__((always_inline)) void FN(few_rows_block)(const FN(few_rows_job) *job, idx_t j0, int n,
                                                                     int M, int chains, const elem *const *rows,
                                                                     idx_t rs, int by_blocks, const char *next_rows)
{
    const attnc_gemm_args *g = job->g;
    idx_t K = g->K;
    real bias[FEW_ROWS_CHAINS][VLANES], sums[FEW_ROWS_CHAINS * GEMM_FEW_ROWS][VLANES];
    for (int c = 0; c < chains; c++)
        for (int l = 0; l < VLANES; l++) bias[c][l] = FN(bias_at)(g, j0 + attnc_min(c * VLANES + l, n - 1));
    const size_t align_bytes = by_blocks ? 16 : VLANES * sizeof(elem);
    for (idx_t p0 = 0; p0 < K; p0 += ATTNC_GEMM_KC) {
        idx_t p = p0, end = attnc_min(K, p0 + ATTNC_GEMM_KC);
        vreal acc[FEW_ROWS_CHAINS * GEMM_FEW_ROWS];
        for (int c = 0; c < chains; c++)
            for (int m = 0; m < M; m++) acc[c * M + m] = p0 == 0 ? vloadu(bias[c]) : vzero();
        int lead = (int)((align_bytes - (uintptr_t)(rows[0] + p) % align_bytes) % align_bytes / sizeof(elem));
        if (lead && p + VLANES <= end) {
            vreal lead_acc[FEW_ROWS_CHAINS * GEMM_FEW_ROWS]; /* (acc's address kept to itself: its rows stay in registers) */
            for (int i = 0; i < chains * M; i++) lead_acc[i] = acc[i];
            FN(few_rows_lead)(lead_acc, rows, rs, job->a, p, lead, M, chains, by_blocks);
            for (int i = 0; i < chains * M; i++) acc[i] = lead_acc[i];
            p += lead;
        }
        for (; p + VLANES <= end; p += VLANES) {
            for (idx_t line = 0; next_rows && line < (idx_t)(VLANES * VLANES * sizeof(elem) / 64); line++)
                __builtin_prefetch(next_rows + (size_t)p * VLANES * sizeof(elem) + line * 64, 0, 1);
            FN(few_rows_turned)(acc, rows, rs, job->a, p, VLANES, M, chains, by_blocks);
        }
        for (; p < end; p++)
            for (int c = 0; c < chains; c++) {
                real step[VLANES];
                for (int l = 0; l < VLANES; l++) step[l] = to_real(rows[c * VLANES + l][p]);
                for (int m = 0; m < M; m++) acc[c * M + m] = vfma(vset1(job->a[p * M + m]), vloadu(step), acc[c * M + m]);
            }
        for (int i = 0; i < chains * M; i++) vstoreu(sums[i], p0 == 0 ? acc[i] : vadd(vloadu(sums[i]), acc[i]));
    }
    for (int c = 0; c < chains && c * VLANES < n; c++)
        for (int m = 0; m < M; m++)
            FN(store_row)((elem *)g->c + m * g->c_rs + j0 + c * VLANES, sums[c * M + m],
                          attnc_min(VLANES, n - c * VLANES));
}

#if FEW_ROWS_LANES
/* C[:, j0, j0 + n) (n <= GEMM_LANES_COLUMNS outputs) with A's M rows in
 * the lanes: accumulator c holds output j0 + c of every row; a step p is
 * one vector of A (its lanes past M zero) times element p of each output's
 * weight row (row_of with rs), broadcast from memory. Nothing is turned in
 * registers and the weights' rows need no alignment: a (8, 768) x (2304,
 * 768)^T float `linear` ran at 78-81 GFLOP/s on a Zen 3 core in a C
 * program of this loop, against 51-60 for few_rows_block, and in the
 * library in 0.81-0.89x few_rows_block's time (GEMM_FEW_ROWS_IN_LANES_FROM,
 * benchmarks/NOTES.md). Each element gets few_rows_block's operations in
 * its order (from the bias, a multiply-add a step, the K blocks' sums
 * added), so the same bits. An output past n repeats the last and is not
 * stored. */
static inline __attribute__((always_inline)) void FN(few_rows_lanes)(const FN(few_rows_job) *job, idx_t j0, int n,
                                                                     const elem *const rows[GEMM_LANES_COLUMNS],
                                                                     idx_t rs)
{
    const attnc_gemm_args *g = job->g;
    idx_t K = g->K;
    real sums[GEMM_LANES_COLUMNS][VLANES];
    for (idx_t p0 = 0; p0 < K; p0 += ATTNC_GEMM_KC) {
        idx_t end = attnc_min(K, p0 + ATTNC_GEMM_KC);
        vreal acc[GEMM_LANES_COLUMNS];
        for (int c = 0; c < GEMM_LANES_COLUMNS; c++)
            acc[c] = p0 == 0 ? vset1(FN(bias_at)(g, j0 + (c < n ? c : n - 1))) : vzero();
        for (idx_t p = p0; p < end; p++) {
            vreal a = vloadu(job->a + p * VLANES);
            _Pragma("GCC unroll 16") for (int c = 0; c < GEMM_LANES_COLUMNS; c++)
                acc[c] = vfma(vset1(FN(row_of)(rows, c, rs)[p]), a, acc[c]);
        }
        for (int c = 0; c < GEMM_LANES_COLUMNS; c++)
            vstoreu(sums[c], p0 == 0 ? acc[c] : vadd(vloadu(sums[c]), acc[c]));
    }
    elem *c_out = (elem *)g->c + j0;
    for (int m = 0; m < g->M; m++)
        for (int c = 0; c < n; c++) c_out[m * g->c_rs + c] = sums[c][m];
}
#endif

/* a copy of few_rows_block's loops for each M the level takes, for rows
 * evenly spaced (rs) or not (0), and loaded by blocks or not (by_blocks a
 * constant in each: tested inside the loop, it left AVX2's 8-row loop
 * with accumulators on the stack, and in a variant GCC hoisted the
 * broadcasts both ways share above the test and spilled them) */
#if ELEM_IS_REAL && defined(VLOAD_BLOCKS)
#  define FEW_ROWS_BY_BLOCKS (job->by_blocks)
#else
#  define FEW_ROWS_BY_BLOCKS 0
#endif
#define FEW_ROWS_COPY(m, rs)                                               \
    if (m >= GEMM_FEW_ROWS_BY_BLOCKS_FROM && FEW_ROWS_BY_BLOCKS)           \
        FN(few_rows_block)(job, j, n, m, 1, rows, rs, 1, NULL);            \
    else if (m <= GEMM_FEW_ROWS_PREFETCH_MAX_ROWS && (rs) && next_rows)    \
        FN(few_rows_block)(job, j, n, m, 1, rows, rs, 0, next_rows);       \
    else                                                                   \
        FN(few_rows_block)(job, j, n, m, 1, rows, rs, 0, NULL);
#define FEW_ROWS_CASE(m)                                                   \
    case m:                                                                \
        if (m <= GEMM_FEW_ROWS && rs) {                                    \
            FEW_ROWS_COPY(m, rs)                                           \
        } else if (m <= GEMM_FEW_ROWS) {                                   \
            FEW_ROWS_COPY(m, 0)                                            \
        }                                                                  \
        break;

/* rows[c] <- the block's weight rows j + c, c < count (past n, the last
 * repeated); returns their spacing rs (rs elements, a constant 0 for none)
 * when they are evenly spaced (one part's, all n), else 0 */
static inline __attribute__((always_inline)) idx_t FN(few_rows_rows)(const FN(few_rows_job) *job, idx_t j, int n,
                                                                     int count, const elem **rows, idx_t rs)
{
    for (int c = 0; c < count; c++) rows[c] = FN(operand_row)(&job->b, j + (c < n ? c : n - 1));
    for (int c = 0; c < count; c++) /* (as addresses: the rows may be of different parts) */
        if ((uintptr_t)rows[c] - (uintptr_t)rows[0] != (uintptr_t)c * (uintptr_t)rs * sizeof(elem)) rs = 0;
    return rs;
}

#if FEW_ROWS_LANES
/* few_rows_task's outputs [first, end) in the lanes: a function of its own,
 * its loops on 64-byte boundaries, so that their place does not move with
 * few_rows_block's copies. Inlined in few_rows_task, 48 bytes past a
 * boundary once those copies grew, the same instructions took 1.03-1.09x
 * the time on `linear` (8, 768) -> 2304 (1 thread, Zen 3); aligned, 1.007x
 * (benchmarks/NOTES.md). */
static __attribute__((noinline, optimize("align-loops=64"))) void FN(few_rows_lanes_task)(const FN(few_rows_job) *job, idx_t first, idx_t end)
{
    for (idx_t j = first; j < end && !attnc_interrupted(); j += GEMM_LANES_COLUMNS) {
        int n = (int)attnc_min(GEMM_LANES_COLUMNS, end - j);
        const elem *rows[GEMM_LANES_COLUMNS];
        idx_t rs = FN(few_rows_rows)(job, j, n, GEMM_LANES_COLUMNS, rows, job->b.rs);
        if (rs)
            FN(few_rows_lanes)(job, j, n, rows, rs);
        else
            FN(few_rows_lanes)(job, j, n, rows, 0);
    }
}
#endif

static void FN(few_rows_task)(void *ctx, idx_t t)
{
    _Static_assert(GEMM_FEW_ROWS <= 8, "a case below for every M up to GEMM_FEW_ROWS");
    const FN(few_rows_job) *job = ctx;
    idx_t columns = job->columns, first = t * job->blocks_per_task * columns;
    idx_t end = attnc_min(job->N, first + job->blocks_per_task * columns);
#if FEW_ROWS_LANES
    if (job->in_lanes) {
        FN(few_rows_lanes_task)(job, first, end);
        return;
    }
#endif
    for (idx_t j = first; j < end && !attnc_interrupted(); j += VLANES) { /* a task may be long: all of K */
        int n = (int)attnc_min(VLANES, end - j);
        const elem *rows[FEW_ROWS_CHAINS * VLANES];
        if (FEW_ROWS_CHAINS > 1 && job->g->M == 1 && FEW_ROWS_BY_BLOCKS && end - j >= FEW_ROWS_CHAINS * VLANES &&
            FN(few_rows_rows)(job, j, FEW_ROWS_CHAINS * VLANES, FEW_ROWS_CHAINS * VLANES, rows, job->b.rs)) {
            /* one row of A: whole blocks' chains side by side, their rows
             * evenly spaced (from a base per four) and loaded by blocks */
            FN(few_rows_block)(job, j, FEW_ROWS_CHAINS * VLANES, 1, FEW_ROWS_CHAINS, rows, job->b.rs, 1, NULL);
            j += (FEW_ROWS_CHAINS - 1) * VLANES;
            continue;
        }
        idx_t rs = FN(few_rows_rows)(job, j, n, VLANES, rows, GEMM_FEW_ROWS_SPACED ? job->b.rs : 0);
        /* the next block's rows, one run of memory when they are one part's
         * contiguous rows */
        const char *next_rows = job->prefetch && rs == job->g->K && job->b.n_parts == 1 && end - j >= 2 * VLANES
                                    ? (const char *)(rows[0] + VLANES * rs)
                                    : NULL;
        switch (job->g->M) {
            FEW_ROWS_CASE(1)
            FEW_ROWS_CASE(2)
            FEW_ROWS_CASE(3)
            FEW_ROWS_CASE(4)
            FEW_ROWS_CASE(5)
            FEW_ROWS_CASE(6)
            FEW_ROWS_CASE(7)
            FEW_ROWS_CASE(8)
        }
    }
}
#undef FEW_ROWS_CASE
#undef FEW_ROWS_COPY
#undef FEW_ROWS_BY_BLOCKS

/* C = bias + A . B^T for M <= GEMM_FEW_ROWS rows of A by few_rows_block or
 * few_rows_lanes: A widened once into a step-major buffer, B (rows of
 * contiguous elements) read in place, nothing packed or padded to a
 * micro-kernel's width. */
static attnc_status FN(gemm_few_rows)(const attnc_gemm_args *g, idx_t N, const FN(gemm_operand) *a,
                                      const FN(gemm_operand) *b)
{
    idx_t M = g->M, K = g->K;
    /* rows 4 KB apart share an L1 set: by blocks, each row's line is read
     * four times a block and lost between; in the lanes, 12 rows' lines
     * are read at once */
    int aliased = (b->rs * (idx_t)sizeof(elem)) % GEMM_SET_ALIASING_BYTES == 0;
    int by_blocks = M >= GEMM_FEW_ROWS_BY_BLOCKS_FROM && !aliased;
    int in_lanes = FEW_ROWS_LANES && M >= GEMM_FEW_ROWS_IN_LANES_FROM && !aliased;
    idx_t a_step = in_lanes ? VLANES : M, elements, bytes;
    if (!attnc_mul_ok(a_step, K, &elements) || !attnc_mul_ok(elements, sizeof(real), &bytes)) return ATTNC_EOVERFLOW;
    real *widened = attnc_malloc((size_t)bytes);
    if (!widened) return ATTNC_ENOMEM;
    for (idx_t i = 0; i < a_step; i++) {
        const elem *row = i < M ? FN(operand_row)(a, i) : NULL;
        for (idx_t p = 0; p < K; p++) widened[p * a_step + i] = row ? to_real(row[p * a->cs]) : 0;
    }
    idx_t columns = in_lanes ? GEMM_LANES_COLUMNS : VLANES;
    idx_t blocks = attnc_ceil_div(N, columns), tasks = GEMM_FEW_ROWS_TASKS * (idx_t)attnc_running_threads();
    double flops = 2.0 * (double)M * (double)N * (double)K;
    double thread_weight_bytes = (double)N * (double)K * (double)sizeof(elem) / attnc_threads_for(flops);
    int prefetch = attnc_cpu_is_intel() && thread_weight_bytes > GEMM_FEW_ROWS_PREFETCH_FROM_BYTES &&
                   thread_weight_bytes <= GEMM_FEW_ROWS_PREFETCH_TO_BYTES;
    FN(few_rows_job) job = {g,       *b, widened, N, attnc_ceil_div(blocks, tasks), a_step, (int)columns, by_blocks,
                            in_lanes, prefetch};
    attnc_parallel_for(attnc_ceil_div(blocks, job.blocks_per_task), flops, FN(few_rows_task), &job);
    attnc_free(widened);
    return attnc_interrupted() ? ATTNC_EINTR : ATTNC_OK;
}
#undef FEW_ROWS_LANES

/* *bytes = size of `rows` rows packed in slivers of `width`, kc steps deep. */
static int FN(packed_bytes)(idx_t rows, idx_t width, idx_t kc, size_t *bytes)
{
    idx_t padded, elements, n;
    if (!attnc_mul_ok(attnc_ceil_div(rows, width), width, &padded) || !attnc_mul_ok(padded, kc, &elements) ||
        !attnc_mul_ok(elements, sizeof(real), &n))
        return 0;
    *bytes = (size_t)n;
    return 1;
}

/* B of g: its parts stacked; their rows, N. */
static FN(gemm_operand) FN(stacked_parts)(const attnc_gemm_args *g, idx_t *N)
{
    FN(gemm_operand) b = {{NULL}, {0}, g->n_parts, g->b_rs, g->b_cs};
    *N = 0;
    for (int q = 0; q < g->n_parts; q++) {
        b.data[q] = g->parts[q].b;
        b.ends[q] = *N += g->parts[q].rows; /* the caller's arrays: no overflow */
    }
    return b;
}

/* Elements of B's packed copy a K block: N rows in NR slivers of a whole
 * block's steps (the last block's shorter slivers start there too); 0 if
 * its bytes overflow. */
static idx_t FN(packed_block_elems)(idx_t N, idx_t K)
{
    size_t bytes;
    idx_t steps = FN(product_steps)(attnc_min(K, ATTNC_GEMM_KC), BF16_PAIRS);
    return FN(packed_bytes)(N, GEMM_NR, steps, &bytes) ? (idx_t)(bytes / sizeof(real)) : 0;
}

/* The kernel table's pack_weights: B's slivers as pack_rows makes them for
 * each K block in turn, block b at b * packed_block_elems (gemm's packed_b);
 * the last block holds its own steps only. Packed by the pool's pack tasks,
 * polled between them (a whole K block between two polls was 96 MiB for a
 * MultiHeadAttention(8192)'s fused weights). */
attnc_status FN(pack_weights)(const attnc_gemm_args *g, void **packed)
{
    idx_t N, K = g->K;
    FN(gemm_operand) b = FN(stacked_parts)(g, &N);
    FN(gemm_job) job = {.b = b, .N = N};
    idx_t block = FN(packed_block_elems)(N, K), full_blocks = (K - 1) / ATTNC_GEMM_KC, total;
    idx_t last = K > 0 ? FN(packed_block_elems)(N, K - full_blocks * ATTNC_GEMM_KC) : 0;
    *packed = NULL;
    if ((N > 0 && K > 0 && (block == 0 || last == 0)) || !attnc_mul_ok(block, full_blocks, &total) ||
        total > PTRDIFF_MAX - last || !attnc_mul_ok(total + last, sizeof(real), &total))
        return ATTNC_EOVERFLOW;
    real *out = attnc_malloc((size_t)total);
    if (!out) return ATTNC_ENOMEM;
    for (idx_t p0 = 0; p0 < K && !attnc_interrupted(); p0 += ATTNC_GEMM_KC) {
        job.p0 = p0;
        job.kc = attnc_min(ATTNC_GEMM_KC, K - p0);
        job.steps = FN(product_steps)(job.kc, BF16_PAIRS);
        job.packed_b = out + p0 / ATTNC_GEMM_KC * block;
        attnc_parallel_for(FN(pack_tasks)(N, GEMM_NR), GEMM_PACK_ELEMENT_FLOPS * (double)N * (double)job.kc,
                           FN(pack_task), &job);
    }
    if (attnc_interrupted()) {
        attnc_free(out);
        return ATTNC_EINTR;
    }
    *packed = out;
    return ATTNC_OK;
}

/* The order and tiling of a product (see the top): which operand is read
 * in place and which packed, how C is cut into tasks, and which packed
 * copies are a thread's own. Sizes only; no buffer is allocated here. */
static FN(gemm_job) FN(plan_job)(const attnc_gemm_args *g, FN(gemm_operand) a, FN(gemm_operand) b, idx_t N,
                                 idx_t kc_max, idx_t threads)
{
    idx_t M = g->M;
    idx_t mc = GEMM_A_BLOCK_BYTES / (ATTNC_GEMM_KC * (idx_t)sizeof(real)) / GEMM_MR * GEMM_MR;
    /* Few rows of A (a short sequence): C^T = B . A^T, so the weights B are
     * read in place by the micro-kernel's broadcasts and only A is packed,
     * into a block that stays in L2 (GEMM_TRANSPOSED_X_BYTES)
     * (packing the weights cost more than multiplying them by a few dozen
     * rows). But A's rows are then the tiles' columns, whole vectors of
     * them (the last tile one vector or two; one counts
     * GEMM_ONE_VECTOR_TILE_ROWS more): when that
     * pads A more than the other orders' edge tiles do (whole
     * GEMM_MR_STEP rows) plus GEMM_PACKING_ROWS, packing contiguous
     * weights costs less, and so it does when a tile's MR rows of them
     * evict each other from L1 (rows_evict_each_other) (weights with a
     * column stride pack one element at a time: not measured, so they keep
     * the transposed order). */
    idx_t transposed_rows = attnc_ceil_div(M, VLANES) * VLANES;
    int one_vector_last = M % GEMM_NR != 0 && M % GEMM_NR <= VLANES;
    int transposed = !g->packed_b && ELEM_IS_REAL && /* the micro-kernel broadcasts reals */
                     M <= (attnc_cpu_is_intel() ? GEMM_TRANSPOSED_MAX_ROWS_INTEL : GEMM_TRANSPOSED_MAX_ROWS) &&
                     transposed_rows * kc_max * (idx_t)sizeof(real) <=
                         (attnc_cpu_is_intel() ? GEMM_TRANSPOSED_X_BYTES_INTEL : GEMM_TRANSPOSED_X_BYTES) &&
                     (b.cs != 1 || (transposed_rows + one_vector_last * GEMM_ONE_VECTOR_TILE_ROWS <=
                                        attnc_ceil_div(M, GEMM_MR_STEP) * GEMM_MR_STEP + GEMM_PACKING_ROWS &&
                                    !rows_evict_each_other(b.rs * (idx_t)sizeof(real), GEMM_MR)));
    /* A whole packed A that stays in L2, and B slivers for every thread:
     * the streamed order (see the top); on Intel at AVX-512, also an A far
     * beyond L2, by blocks of B slivers (GEMM_FAR_A_BY_B_BLOCKS) */
    idx_t a_block_bytes = attnc_ceil_div(M, GEMM_MR) * GEMM_MR * kc_max * (idx_t)sizeof(real);
    idx_t streamed_max = attnc_cpu_is_intel() ? GEMM_STREAMED_A_BYTES_FAR_L3 : GEMM_STREAMED_A_BYTES;
    /* Streamed, A's whole slivers read in place by the micro-kernel's
     * broadcasts (contiguous rows of reals), only a last partial one packed
     * (GEMM_STREAMED_A_IN_PLACE), unless its rows share an L1 set
     * (GEMM_SET_ALIASING_BYTES) */
    int a_in_place = GEMM_STREAMED_A_IN_PLACE && ELEM_IS_REAL && a.cs == 1 &&
                     (a.rs * (idx_t)sizeof(real)) % GEMM_SET_ALIASING_BYTES != 0;
    int own_copies = threads > 1 && threads <= GEMM_OWN_COPY_THREADS;
    /* The blocked order's tasks: row blocks of at most mc rows; column
     * blocks of at most NC columns, narrower when there are too few row
     * blocks to keep every thread busy: at least two tasks per thread. With
     * one column block its tasks read A once (a_by_task), and a far A
     * takes it: against far-x, 5 rounds, best / median, (65536, 768) -> 256
     * 0.80 / 0.78x on 2 threads and 0.86 / 0.79x on 1, (65536, 512) -> 512
     * 0.79 / 0.78x and 0.92 / 0.93x, (65536, 1024) -> 256 on 1 thread 0.63
     * / 0.62x, (8192, 768) -> 384 1.01 / 1.00x and 0.88 / 0.86x (a Xeon
     * family 6 model 207, benchmarks/NOTES.md) */
    idx_t row_blocks = attnc_ceil_div(M, mc), slivers = attnc_ceil_div(N, GEMM_NR);
    idx_t for_threads = attnc_ceil_div(2 * threads, row_blocks), for_nc = attnc_ceil_div(slivers, GEMM_NC / GEMM_NR);
    idx_t col_blocks = attnc_min(slivers, for_threads > for_nc ? for_threads : for_nc);
    int far_a = GEMM_FAR_A_BY_B_BLOCKS && attnc_cpu_is_intel() && a_block_bytes > GEMM_STREAMED_A_BYTES &&
                col_blocks > 1 && (a_in_place || !own_copies || a_block_bytes <= GEMM_FAR_A_COPY_BYTES);
    int streamed = !transposed && attnc_ceil_div(N, GEMM_NR) >= 2 * threads && (far_a || a_block_bytes <= streamed_max);
    FN(gemm_job) job = {.c = (real *)g->c, .c_rs = g->c_rs, .transposed = transposed, .streamed = streamed,
                        .packed_weights = transposed ? NULL : g->packed_b,
                        .packed_block = g->packed_b ? FN(packed_block_elems)(N, g->K) : 0};
    if (transposed) {
        /* the job's rows are B's: two blocks of them per thread */
        job.M = N, job.N = M, job.a = b, job.b = a;
        job.n_row_blocks = attnc_min(2 * threads, attnc_ceil_div(N, GEMM_MR)), job.n_col_blocks = 1;
        /* slivers whose MR rows are not one part's evenly spaced rows */
        for (int q = 0; q < b.n_parts; q++) {
            idx_t start = b.ends[q] / GEMM_MR * GEMM_MR; /* the sliver holding a part's end */
            int cut = b.ends[q] % GEMM_MR != 0, seen = job.n_irregular && job.irregular[job.n_irregular - 1] == start;
            if (cut && !seen) job.irregular[job.n_irregular++] = start;
        }
    } else if (streamed) {
        /* one row block; GEMM_STREAMED_TASKS column blocks per thread of
         * whole B slivers, at most a sliver each; a far A's tasks take their
         * slivers in even blocks of at most GEMM_STREAMED_B_BLOCK_BYTES */
        job.M = M, job.N = N, job.a = a, job.b = b;
        job.n_row_blocks = 1;
        job.n_col_blocks = attnc_min(attnc_ceil_div(N, GEMM_NR), GEMM_STREAMED_TASKS * threads);
        idx_t task_slivers = attnc_ceil_div(attnc_ceil_div(N, GEMM_NR), job.n_col_blocks);
        idx_t block_max = GEMM_STREAMED_B_BLOCK_BYTES / (GEMM_NR * kc_max * (idx_t)sizeof(real));
        job.block_slivers =
            far_a && block_max > 1 ? attnc_ceil_div(task_slivers, attnc_ceil_div(task_slivers, block_max)) : 1;
    } else {
        job.M = M, job.N = N, job.a = a, job.b = b;
        job.n_row_blocks = row_blocks, job.n_col_blocks = col_blocks;
        /* One column block: a task packs its own row block of A, which no
         * other task reads, into its thread's block that stays in L2,
         * instead of pass 1 packing all of A into memory for pass 2 to read
         * back (a fresh buffer of A's size each call: 23 % of a (65536,
         * 1024) x (256, 1024)^T product's samples were the kernel clearing
         * its pages). On a Xeon family 6 model 207, 2 threads, 9 rounds,
         * best / median: that product 0.74 / 0.74x the time, (16384, 1024)
         * -> 512 0.90 / 0.88x, (1024, 512) -> 512 0.98 / 0.90x, module (8,
         * 128, 512) 0.98 / 0.97x, frozen 0.93 / 0.97x; 1 thread 0.96-1.04x
         * (benchmarks/NOTES.md) */
        job.a_by_task = job.n_col_blocks == 1;
    }
    /* packed A and B: a transposed job's A its irregular slivers, a
     * streamed job's B a block of slivers per task; the small operand (A
     * streamed, B transposed) in a copy a thread up to GEMM_OWN_COPY_THREADS */
    job.own_copies = (streamed || transposed) && own_copies ? (int)threads : 0;
    job.a_packed_from = streamed && a_in_place ? M / GEMM_MR * GEMM_MR : 0;
    return job;
}

attnc_status FN(gemm)(const attnc_gemm_args *g)
{
    idx_t M = g->M, N, K = g->K;
    FN(gemm_operand) a = {{g->a}, {M}, 1, g->a_rs, g->a_cs}, b = FN(stacked_parts)(g, &N);
    int any_bias = 0;
    for (int q = 0; q < g->n_parts; q++) any_bias |= g->parts[q].bias != NULL;
    if (M <= 0 || N <= 0) return ATTNC_OK;
    /* (pairs: the direct loops' products would not be vdot_pairs') */
    if (K == 0 || (!BF16_PAIRS && (double)M * (double)N * (double)K <= GEMM_DIRECT_MAX_MACS)) {
        attnc_note_gemm_order(ATTNC_GEMM_DIRECT);
        FN(gemm_direct)(g, N, &a, &b);
        return ATTNC_OK;
    }
    /* The few-rows and transposed orders read the weights in place because
     * packing them costs more than a few rows' products: weights packed
     * already (packed_b) take the packed orders at any M (the same bits).
     * On a Xeon family 6 model 207, frozen modules against frozen modules
     * without this (best / median, 2 threads): (1, 8, 768) 0.74 / 0.79x the
     * time, (1, 16, 512) 0.68 / 0.73x, (4, 8, 768) 0.82 / 0.73x, (1, 4,
     * 1024) 0.90 / 0.88x, (1, 1, 768) 0.90 / 0.96x, (1, 32, 256) 0.97 /
     * 0.96x; 1 thread (1, 8, 768) 0.82 / 0.72x (benchmarks/NOTES.md). */
    if (!BF16_PAIRS && M <= GEMM_FEW_ROWS && b.cs == 1 && !g->packed_b) {
        attnc_note_gemm_order(ATTNC_GEMM_FEW_ROWS);
        return FN(gemm_few_rows)(g, N, &a, &b);
    }
    idx_t kc_max = attnc_min(K, ATTNC_GEMM_KC), threads = attnc_threads_for(2.0 * M * N * kc_max);
    FN(gemm_job) job = FN(plan_job)(g, a, b, N, kc_max, threads);
    int transposed = job.transposed, streamed = job.streamed;
    attnc_note_gemm_order(transposed ? ATTNC_GEMM_TRANSPOSED
                          : streamed ? (job.block_slivers > 1 ? ATTNC_GEMM_FAR_X : ATTNC_GEMM_STREAMED)
                                     : ATTNC_GEMM_BLOCKED);
    size_t a_bytes, b_bytes;
    idx_t steps_max = FN(product_steps)(kc_max, BF16_PAIRS);
    idx_t a_rows = transposed       ? job.n_irregular * GEMM_MR
                   : job.a_by_task ? attnc_ceil_div(attnc_ceil_div(job.M, GEMM_MR), job.n_row_blocks) * GEMM_MR
                                   : job.M; /* (a_by_task: the largest row block, gemm_block_start) */
    if (!FN(packed_bytes)(a_rows, GEMM_MR, steps_max, &a_bytes) ||
        !FN(packed_bytes)(job.packed_weights ? 0 : streamed ? job.n_col_blocks * job.block_slivers * GEMM_NR : job.N,
                          GEMM_NR, steps_max, &b_bytes))
        return ATTNC_EOVERFLOW;
    /* the copies a thread: own copies of the small operand, or of a task's block of A */
    size_t *small = transposed ? &b_bytes : &a_bytes, copies = job.own_copies ? (size_t)job.own_copies
                                                               : job.a_by_task ? (size_t)threads
                                                                               : 0;
    job.own_stride = (idx_t)(*small / sizeof(real));
    if (copies && *small > SIZE_MAX / copies) return ATTNC_EOVERFLOW;
    if (copies) *small *= copies;
    idx_t sums_bytes = 0;
    if (!ELEM_IS_REAL && (!attnc_mul_ok(M, N, &sums_bytes) || !attnc_mul_ok(sums_bytes, sizeof(real), &sums_bytes)))
        return ATTNC_EOVERFLOW;
    /* one part's bias of reals is read in place; several, or elems, are
     * stacked (N reals) */
    int stack_bias = any_bias && (g->n_parts > 1 || !ELEM_IS_REAL);
    real *stacked_bias = stack_bias ? attnc_malloc((size_t)N * sizeof(real)) : NULL;
    job.bias = stack_bias ? stacked_bias : (const real *)g->parts[0].bias;
    /* elems: C summed in reals, (M, N), rounded at the end */
    real *sums = ELEM_IS_REAL ? NULL : attnc_malloc((size_t)sums_bytes);
    if (sums) job.c = sums, job.c_rs = N;
    job.packed_a = attnc_malloc(a_bytes);
    job.packed_b = attnc_malloc(b_bytes);
    attnc_status status = ATTNC_ENOMEM;
    if (!job.packed_a || !job.packed_b || (stack_bias && !stacked_bias) || (!ELEM_IS_REAL && !sums)) goto done;
    if (transposed) {
        /* a panel a thread (C^T's edge tiles are computed there, padding
         * rows and columns included) */
        job.panel_stride = attnc_ceil_div(job.N, GEMM_NR) * GEMM_NR;
        size_t panel_bytes;
        if (!FN(packed_bytes)(threads * GEMM_PANEL_ROWS, 1, job.panel_stride, &panel_bytes)) {
            status = ATTNC_EOVERFLOW;
            goto done;
        }
        if (!(job.panels = attnc_malloc(panel_bytes))) goto done;
    }
    for (idx_t j = 0; stack_bias && j < N; j++) stacked_bias[j] = FN(bias_at)(g, j);

    double packing_flops = GEMM_PACK_ELEMENT_FLOPS * (double)(a_bytes + b_bytes) / sizeof(real);
    for (idx_t p0 = 0; p0 < K; p0 += ATTNC_GEMM_KC) {
        job.p0 = p0;
        job.kc = attnc_min(ATTNC_GEMM_KC, K - p0);
        job.steps = FN(product_steps)(job.kc, BF16_PAIRS);
        idx_t n_pack_a, n_pack_b;
        FN(pass1_packs)(&job, &n_pack_a, &n_pack_b);
        attnc_parallel_for(n_pack_a + n_pack_b, packing_flops, FN(pack_task), &job);
        /* (own copies: on the threads they were made for; and never on more
         * threads than the job's buffers were made for, `threads`, should
         * another Python thread raise the count meanwhile: the transposed
         * order's panels are one a thread) */
        for (int q = 0; q < GEMM_OWN_COPY_THREADS; q++) job.own_packed[q] = 0;
        int on = job.own_copies ? job.own_copies : (int)attnc_min(threads, attnc_threads_for(2.0 * M * N * job.kc));
        attnc_parallel_for_on(job.n_row_blocks * job.n_col_blocks, on, FN(multiply_task), &job);
    }
    status = attnc_interrupted() ? ATTNC_EINTR : ATTNC_OK;
    for (idx_t i = 0; sums && status == ATTNC_OK && i < M; i++) FN(store_row)((elem *)g->c + i * g->c_rs, sums + i * N, N);
done:
    attnc_free(sums);
    attnc_free(stacked_bias);
    attnc_free(job.packed_a);
    attnc_free(job.packed_b);
    attnc_free(job.panels);
    return status;
}
