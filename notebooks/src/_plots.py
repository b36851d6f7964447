# Plot helpers shared by the notebooks (build.py copies this cell into each one).
import matplotlib.pyplot as plt
import numpy as np

plt.rcParams["figure.dpi"] = 110


def plot_attention(weights, mask=None, title="attention weights", row_names=None, col_names=None,
                   axis_names=("query", "key")):
    """Annotated heatmaps of attention weights of shape (seq, seq), (batch, seq, seq) or
    (batch, heads, seq, seq): one row of panels per batch element, one column per head.
    Keys masked out (mask value 0 / False, broadcast like the module's mask) are hatched."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim not in (2, 3, 4):
        raise ValueError(f"weights: expected 2 to 4 dims, got shape {weights.shape}")
    # (seq, seq) -> one panel; (batch, seq, seq) -> batch elements side by side; 4-D -> a grid
    grid = weights[(None,) * (4 - weights.ndim)]
    masked = None
    if mask is not None:
        masked = np.broadcast_to(np.asarray(mask) == 0, weights.shape).reshape(grid.shape)
    n_rows, n_cols, n_queries, n_keys = grid.shape
    cell = 0.42 if max(n_queries, n_keys) > 2 else 0.55
    fig, axes = plt.subplots(n_rows, n_cols, squeeze=False, constrained_layout=True,
                             figsize=(n_cols * (cell * n_keys + 0.45) + 1.0, n_rows * (cell * n_queries + 0.5) + 0.5))
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r, c]
            panel = grid[r, c]
            image = ax.imshow(panel, vmin=0.0, vmax=1.0, cmap="viridis")
            for i in range(n_queries):
                for j in range(n_keys):
                    value = panel[i, j]
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if value > 0.55 else "white")
                    if masked is not None and masked[r, c, i, j]:
                        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                                                   edgecolor=(0.9, 0.2, 0.2, 0.8), linewidth=0))
            ax.set_xticks(range(n_keys))
            ax.set_yticks(range(n_queries))
            ax.tick_params(labelsize=7, length=0)
            if col_names is not None and r == 0:
                ax.set_title(col_names[c], fontsize=8)
            if c == 0:
                ax.set_ylabel(axis_names[0] if row_names is None else f"{row_names[r]}\n{axis_names[0]}", fontsize=8)
    axes[-1, 0].set_xlabel(axis_names[1], fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label="weight")
    fig.suptitle(title + ("  (hatched: masked key)" if masked is not None and masked.any() else ""), fontsize=9)
    plt.show()
