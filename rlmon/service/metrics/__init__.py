"""The metric vocabulary: statistic forms and their merge, the catalog of canonical metrics, the
framework key maps.
"""
