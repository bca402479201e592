from rest_framework.parsers import BaseParser


class YAMLParser(BaseParser):
    """Hands the raw text to the mission-file importer, which parses and reports errors."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream.read().decode("utf-8", errors="replace")


class JSONTextParser(YAMLParser):
    """A JSON mission file as text too: the importer reads it like YAML (JSON is YAML), so a
    mistake in it reads as the command line reports it for the same file."""

    media_type = "application/json"
