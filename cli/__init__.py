"""The `semgate` command (cli.main): the one place that imports every package. Each
command imports what it runs only when it runs, so `semgate --help` stays fast."""
