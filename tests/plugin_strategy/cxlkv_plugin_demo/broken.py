"""A plugin whose import fails: the master must refuse to start, loudly."""

raise ImportError("cxlkv_plugin_demo.broken needs a library that is not installed")
