from trainguard.util.processes import die_with_launcher

# First, before the seconds of imports below: a worker whose launcher is gone must not start.
die_with_launcher()

from trainguard.cli import main  # noqa: E402

main()
