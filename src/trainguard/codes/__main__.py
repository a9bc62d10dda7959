from trainguard.codes import render_markdown

print(render_markdown(), end="")
