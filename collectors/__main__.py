from collectors.cli import entry

entry()
