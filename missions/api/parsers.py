from rest_framework.parsers import BaseParser


class YAMLParser(BaseParser):
    """Hands the raw text to the mission-file importer, which parses and reports errors."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream.read().decode("utf-8", errors="replace")


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"
