"""verifier"""
