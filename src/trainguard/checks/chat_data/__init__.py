"""Checks of instruction-tuning (chat) data: `trainguard data check-chat` and the Trainer's
pre-flight (`check_chat_dataset`). Modules: rows (what an example is), tokenizer (loading the
tokenizer and templates), render (renderings and message spans), structure, labels (loss mask
and truncation), packing, collect (findings with example ids), check (the command's checks),
dataset (a Trainer's dataset and collator)."""

from trainguard.checks.chat_data.check import ChatReport, check_chat_file, check_chat_rows
from trainguard.checks.chat_data.dataset import check_chat_dataset

__all__ = ["ChatReport", "check_chat_dataset", "check_chat_file", "check_chat_rows"]
