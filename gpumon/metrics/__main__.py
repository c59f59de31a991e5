from gpumon.metrics import render_markdown

print(render_markdown(), end="")
