"""Writing the project's artifacts safely (files.py): atomic writes, the modes a plain ``open()`` gives, never over a
derived artifact the run did not write unless told to, backups of what is replaced. Standard library only."""
