"""edl.torch.SparseEmbedding: an embedding whose rows live on the parameter server (edl.ps).

    emb = edl.torch.SparseEmbedding(1, dim=8, mode="mean", optimizer="adagrad", lr=0.05)
    pooled = emb(ids)            # ids (batch, slots) int64: each example's rows, pooled
    loss.backward()              # pushes the rows' gradients in the job's mode
    edl.fleet.step()             # the step's end (sync's barrier, geo's sync)
    emb.prefetch(next_ids)       # async: the next batch's rows pulled while this one computes

Like torch.nn.EmbeddingBag: ``mode`` "sum", "mean" or "max" pools each example's rows (ids of
shape (batch, slots), or 1-D ids with ``offsets``; ``per_sample_weights`` with "sum"), and
``mode=None`` gives every id's row (shape ids.shape + (dim,)), as nn.Embedding. The forward
pulls the batch's rows through the worker (a repeated id is fetched once by the C client); the
backward pushes their gradients (a repeated id's summed by the C client) and the servers apply
them with the table's optimizer: the rows are no parameter of the module, and no torch
optimizer touches them. In eval mode (``module.eval()``) the rows are the servers' own (after
this worker's queued pushes), not GEO's local copies, and nothing is pushed.
"""
import torch
import torch.nn.functional as F

from . import ps

__all__ = ["SparseEmbedding"]

_POOLS = ("sum", "mean", "max", None)


class _Rows(torch.autograd.Function):
    """The batch's rows: pulled in forward, their gradients pushed in backward."""

    @staticmethod
    def forward(ctx, anchor, table, keys, direct):
        ctx.table = table
        ctx.save_for_backward(keys)  # torch tells when they were changed in place since
        return table.pull(keys, direct=direct)

    @staticmethod
    def backward(ctx, grad):
        keys, = ctx.saved_tensors
        ctx.table.push(keys, grad.to(torch.float32).contiguous())
        return None, None, None, None


class SparseEmbedding(torch.nn.Module):
    """``SparseEmbedding(table, dim=None, mode="mean", worker=None, **table_options)``: table
    is an edl.ps.SparseTable (of a plain accessor), or its id, then created with dim and the
    options (optimizer, lr, init, init_scale, seed, replicas, ...; see edl.ps.SparseTable) on
    the worker (the fleet's by default)."""

    def __init__(self, table, dim=None, mode="mean", worker=None, **table_options):
        super().__init__()
        if mode not in _POOLS:
            raise ValueError(f"SparseEmbedding: mode {mode!r}: sum, mean, max or None")
        if isinstance(table, ps.SparseTable):
            if dim is not None and dim != table.dim:
                raise ValueError(f"SparseEmbedding: dim {dim}, but table {table.id} has rows "
                                 f"of {table.dim}")
            if worker is not None or table_options:
                raise ValueError("SparseEmbedding: worker and table options go with a table "
                                 "id, not with a table made already")
        else:
            if dim is None:
                raise ValueError("SparseEmbedding: give dim with a table id")
            table = ps.SparseTable(table, dim, worker=worker, **table_options)
        if table.width != table.dim:
            raise ValueError(f"SparseEmbedding: table {table.id} has the CTR accessor, whose "
                             f"pushes carry show and click: push it with SparseTable.push")
        self.table, self.dim, self.mode = table, table.dim, mode
        # Gives the pulled rows a place in the autograd graph, so that backward reaches the
        # push; not a parameter: no optimizer of the model sees it.
        self._anchor = torch.empty(0, requires_grad=True)

    @staticmethod
    def _keys(ids):
        if not torch.is_tensor(ids):
            raise TypeError(f"SparseEmbedding: ids are a {type(ids).__name__}; want an int64 "
                            f"tensor")
        if ids.dtype != torch.int64:
            raise TypeError(f"SparseEmbedding: ids are {ids.dtype}; want torch.int64")
        return ids.reshape(-1).contiguous()

    def forward(self, ids, offsets=None, per_sample_weights=None):
        keys = self._keys(ids)
        rows = _Rows.apply(self._anchor, self.table, keys, not self.training)
        if self.mode is None:
            return rows.view(*ids.shape, self.dim)
        if offsets is not None or ids.dim() == 1:
            if offsets is None:
                raise ValueError("SparseEmbedding: 1-D ids need offsets (each bag's first "
                                 "index), as EmbeddingBag's")
            return F.embedding_bag(torch.arange(keys.numel()), rows, offsets, mode=self.mode,
                                   per_sample_weights=per_sample_weights)
        if ids.dim() != 2:
            raise ValueError(f"SparseEmbedding: ids of shape {tuple(ids.shape)}: want (batch, "
                             f"ids) or 1-D with offsets")
        bags = rows.view(ids.shape[0], ids.shape[1], self.dim)
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ValueError("SparseEmbedding: per_sample_weights go with mode 'sum'")
            return (bags * per_sample_weights.unsqueeze(-1)).sum(1)
        if self.mode == "sum":
            return bags.sum(1)
        if self.mode == "mean":
            return bags.mean(1)
        return bags.max(1).values

    def prefetch(self, ids):
        """async: the rows of a coming forward's ids (the next batch's) are pulled now, while
        this batch computes; that forward takes them. Other modes: nothing."""
        self.table.prefetch(self._keys(ids))

    def extra_repr(self):
        return f"table={self.table.id}, dim={self.dim}, mode={self.mode!r}"
