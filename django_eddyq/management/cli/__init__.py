"""``python manage.py eddyq …``: the operator's command line, one module per group of
subcommands, all printing through ``output``. Each reads and changes the queue through the same
functions as the admin and the Python API."""
