"""Neo's built-in plugins; each subpackage is a plugin registered through the ``neo`` entry points."""
