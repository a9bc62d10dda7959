from trainguard.config.docs import render_markdown

print(render_markdown(), end="")
