"""Tensor parallelism: one engine replica across N processes, one per device, over torch.distributed.

Rank 0 is the engine (scheduler, block manager, sampler, the server); it starts ranks 1..N-1
(`worker`), which only run the model. Each step rank 0 sends the batch's metadata to the others
(`step_broadcast`), and every rank runs the same `ModelRunner.step` over its shard of the weights
(`sharding`) and of the paged KV cache, meeting in the all-reduces and the logit gather
(`parallel_state`). `executor` is rank 0's side of it; `watchdog` takes the replica down when a rank dies
or a collective stalls.
"""
