"""External shapes shared by every component (pydantic v2 models).

Components never import each other; they meet here.
"""
