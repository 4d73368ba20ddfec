"""Reading matplotlib figures back: artists, bars, legend overlaps."""




def artist(fig, gid, kind="lines"):
    found = [a for ax in fig.axes for a in getattr(ax, kind) if a.get_gid() == gid]
    assert len(found) == 1, (gid, found)
    return found[0]


def bars(fig, gid):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def assert_legends_clear_of_the_axes(fig):
    """Every legend lies outside every axes of the figure, so it covers no data whatever the
    controls draw."""
    fig.draw_without_rendering()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    for legend in legends:
        box = legend.get_window_extent()
        for ax in fig.axes:
            assert overlap_px(box, ax.get_window_extent()) < 1.0, (legend, ax.get_title())


# ---- what every explorer's figure owes its reader -------------------------------------------
def overlap_px(a, b) -> float:
    """Area (square pixels) shared by two display-space boxes."""
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(width, 0.0) * max(height, 0.0)
